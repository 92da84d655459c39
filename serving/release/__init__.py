"""A release on a node: its manifest, the model store, Ed25519 signatures, the fidelity probe and
the CPU features the INT8 kernels depend on."""
