from __future__ import annotations

import json
import logging
from pathlib import Path

from serving.telemetry.logs import configure, request_id


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
