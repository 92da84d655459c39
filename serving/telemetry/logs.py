"""Structured JSON logs carrying the request id and the W3C trace id, with rotation limits."""

from __future__ import annotations

import itertools
import logging
import logging.handlers
import os
import sys
import time
import uuid
from contextvars import ContextVar
from pathlib import Path

import msgspec

from serving.config import environment

ENCODER = msgspec.json.Encoder(enc_hook=str)  # anything not JSON as its str(), as before
request_id: ContextVar[str | None] = ContextVar("request_id", default=None)
# set by serving.telemetry.tracing
trace_id: ContextVar[str | None] = ContextVar("trace_id", default=None)


class RequestIds:
    """Request ids for requests that bring none: this process's random prefix and a counter, 32
    hex digits like a uuid4's, without its system call per request. A forked worker draws a
    prefix of its own."""

    def __init__(self) -> None:
        self.renew()
        os.register_at_fork(after_in_child=self.renew)

    def renew(self) -> None:
        self.prefix, self.count = uuid.uuid4().hex[:16], itertools.count(1)

    def next(self) -> str:
        return f"{self.prefix}{next(self.count):016x}"


IDS = RequestIds()


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service
        worker = environment.worker_index()  # which of several (serving.transport.workers)
        self.worker = {} if worker is None else {"worker": worker}

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(), "service": self.service, "logger": record.name,
            "msg": record.getMessage(), "request_id": request_id.get(),
            "trace_id": trace_id.get(), **self.worker,
        }
        entry.update(getattr(record, "fields", {}))
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return ENCODER.encode(entry).decode()


def configure(service: str, level: str, log_file: Path | None, max_bytes: int,
              backups: int) -> None:
    """Root logger -> JSON on stderr and, when configured, a size-rotated file."""
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.handlers.RotatingFileHandler(
            log_file, maxBytes=max_bytes, backupCount=backups, encoding="utf-8"))
    formatter = JsonFormatter(service)
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        handler.setFormatter(formatter)
        root.addHandler(handler)
    root.setLevel(level.upper())
