"""Cascade benchmark (``python -m bench.cascade``): curve, measure, report, __main__."""
