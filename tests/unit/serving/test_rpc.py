"""The gRPC transport's request decoding, in a process of its own (``rpc_cases.py`` says
why): typed ``contents`` are read from the field of the input's datatype; only server faults
are logged with the access log off."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CASES = Path(__file__).with_name("rpc_cases.py")


def test_grpc_contents_decoding_and_the_access_log_in_a_process_of_their_own() -> None:
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "no:randomly", str(CASES)], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).parents[3])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "4 passed" in done.stdout, done.stdout[-1000:]
