"""``python -m bench.chaos``: the chaos report. The session it runs (record real requests
through nginx, replay them while connections drop, bodies arrive corrupted and edges, the
center and the registry are killed) is ``harness.chaos``, which ``tests/chaos`` runs bounded.
"""
