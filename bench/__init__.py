"""Benchmarks (run as scripts, e.g. ``.venv/bin/python bench/serving.py``); not tests."""
