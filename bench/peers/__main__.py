"""``python -m bench.peers``: the peer comparison (bench/peers/run.py)."""

from bench.peers.run import main

main()
