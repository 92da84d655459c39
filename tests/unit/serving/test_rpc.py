"""The gRPC transport's request decoding, in a process of its own (``rpc_cases.py`` says
why): typed ``contents`` are read from the field of the input's datatype."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CASES = Path(__file__).with_name("rpc_cases.py")


def test_grpc_typed_contents_are_read_from_their_datatypes_field() -> None:
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "no:randomly", str(CASES)], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).parents[3])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "2 passed" in done.stdout, done.stdout[-1000:]
