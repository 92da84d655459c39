"""Model-facing numerics with no serving machinery: tokenization, scores from logits, TorchScript
in and out (the registry's publish pipeline uses them too)."""
