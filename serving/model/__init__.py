"""Model-facing numerics with no serving machinery: tokenization, scores from logits, TorchScript
in and out, a model run over fixed rows (the registry's publish pipeline and the benchmarks use
them too)."""
