"""Peer comparison (``python -m bench.peers``): measure, report, run (the entry point)."""
