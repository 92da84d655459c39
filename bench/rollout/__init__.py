"""Model-sync benchmark (``python -m bench.rollout``): measure, report, __main__."""
