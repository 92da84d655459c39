"""The second demo release: MNIST digits (PNG requests), a tiny edge CNN and a larger center."""
