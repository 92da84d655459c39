"""The bad requests of a chaos run: bodies corrupted four ways, connections dropped two ways."""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

CORRUPTIONS = ("truncated-json", "broken-utf8", "wrong-datatype", "huge-string")
HUGE = 1 << 19  # one 512 KiB string: over the 64 KiB per-string limit, under the 1 MiB body limit


def corrupt(body: dict[str, Any], kind: str) -> bytes:
    """A request body that a correct server must refuse with a 4xx."""
    raw = json.dumps(body).encode()
    if kind == "truncated-json":
        return raw[:len(raw) // 2]
    if kind == "broken-utf8":
        return raw.replace(b'"data": ["', b'"data": ["\xff\xfe\xc3(', 1)
    tensor = dict(body["inputs"][0])
    if kind == "wrong-datatype":
        tensor["datatype"] = "FP32"  # strings declared as floats
    elif kind == "huge-string":
        tensor["data"] = ["x" * HUGE]
        tensor["shape"] = [1]
    else:
        raise ValueError(kind)
    return json.dumps({**body, "inputs": [tensor]}).encode()


def drop(host: str, port: int, path: str, body: bytes, midway: bool) -> None:
    """Open a connection and abandon it: ``midway`` after half the body, else after the whole
    request without reading the answer. Closed with a reset (SO_LINGER 0), like a client that
    died."""
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(head + (body[:len(body) // 2] if midway else body))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
