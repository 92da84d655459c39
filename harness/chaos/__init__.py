"""Chaos replay: record real requests through nginx, replay them against the running stack while
connections drop, bodies arrive corrupted and edges, the center and the registry are killed.

``record`` writes the recording, ``faults`` makes the bad requests, ``replay`` drives the run and
the kills, ``run`` holds one session and its tables; ``tests/chaos`` runs a bounded session,
``python -m bench.chaos`` the full report.
"""
