from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

from serving.telemetry.logs import IDS, configure, request_id


def test_json_lines_with_request_id_and_rotation(tmp_path: Path) -> None:
    log_file = tmp_path / "edge.log"
    configure("edge", "INFO", log_file, max_bytes=2048, backups=2)
    token = request_id.set("trace-42")
    try:
        for i in range(100):
            logging.getLogger("test").info("line %d", i, extra={"fields": {"n": i}})
    finally:
        request_id.reset(token)
        root = logging.getLogger()
        for handler in list(root.handlers):
            handler.close()
            root.removeHandler(handler)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["edge.log", "edge.log.1", "edge.log.2"]  # rotated, bounded
    assert all(p.stat().st_size <= 2048 for p in tmp_path.iterdir())
    last = json.loads(log_file.read_text().splitlines()[-1])
    assert last["msg"] == "line 99" and last["request_id"] == "trace-42"
    assert last["service"] == "edge" and last["n"] == 99 and last["level"] == "info"


def test_request_ids_are_a_prefix_and_a_counter_and_a_forked_child_draws_its_own_prefix(
) -> None:
    """32 hex digits like a uuid4's: the process's random prefix, then a counter. A worker
    forked from a parent that already made ids must not repeat the parent's (or a sibling's)."""
    first, second = IDS.next(), IDS.next()
    assert re.fullmatch("[0-9a-f]{32}", first) and re.fullmatch("[0-9a-f]{32}", second)
    assert second[:16] == first[:16] and int(second[16:], 16) == int(first[16:], 16) + 1
    children = []
    for _ in range(2):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its first id, then gone without running pytest's exit
            try:
                os.write(write, IDS.next().encode())
            finally:
                os._exit(0)
        os.close(write)
        children.append(os.read(read, 64).decode())
        os.close(read)
        assert os.waitpid(pid, 0)[1] == 0
    for child in children:
        assert re.fullmatch("[0-9a-f]{32}", child) and child[16:] == f"{1:016x}"
        assert child[:16] != first[:16]
    assert children[0][:16] != children[1][:16]
    assert IDS.next()[:16] == first[:16]  # the parent keeps its own
