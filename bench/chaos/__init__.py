"""Chaos replay: record real requests through nginx, replay them against the running stack while
connections drop, bodies arrive corrupted and edges, the center and the registry are killed.

``record`` writes the recording, ``faults`` makes the bad requests, ``replay`` drives the run and
the kills, ``__main__`` (``python -m bench.chaos``) prints the report; ``tests/chaos`` runs a
bounded version.
"""
