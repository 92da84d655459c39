"""Benchmarks, run as modules (``.venv/bin/python -m bench.tiers``, ``make bench`` for all); not
tests. Each prints its tables and writes a fragment of ``docs/benchmarks.md``."""
