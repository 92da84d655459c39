"""Network faults on loopback: a TCP proxy that can cut every connection mid-stream, and the
small HTTP peers an attacker would run (a fake edge or center)."""

from __future__ import annotations

import http.server
import json
import socket
import ssl
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


class CutProxy:
    """Forwards 127.0.0.1:<port> to ``target``. ``cut_after(n)``: once ``n`` more bytes went
    downstream (server to client), every open connection is reset, as a flaky link would."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.cuts = 0
        self._remaining: int | None = None
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def cut_after(self, nbytes: int) -> None:
        with self._lock:
            self._remaining = nbytes

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:  # the target is down (restarting): this client is refused
                client.close()
                continue
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, False),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True),
                             daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, downstream: bool) -> None:
        try:
            while data := source.recv(65536):
                if downstream and self._forward_before_cut(data, sink):
                    return
                sink.sendall(data)
        except OSError:
            pass
        for s in (source, sink):
            _close(s)

    def _forward_before_cut(self, data: bytes, sink: socket.socket) -> bool:
        with self._lock:
            if self._remaining is None:
                return False
            if len(data) < self._remaining:
                self._remaining -= len(data)
                return False
            sink.sendall(data[:self._remaining])
            self._remaining = None
            self.cuts += 1
            doomed, self._sockets = self._sockets, []
        for s in doomed:
            _close(s, reset=True)
        return True

    def close(self) -> None:
        self._closed = True
        self.listener.close()
        with self._lock:
            doomed, self._sockets = self._sockets, []
        for s in doomed:
            _close(s)


def _close(s: socket.socket, reset: bool = False) -> None:
    try:
        if reset:  # RST instead of FIN: the peer sees a broken connection
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    except OSError:
        pass


class JsonHandler(http.server.BaseHTTPRequestHandler):
    """A stand-in HTTP peer (a fake edge or center an attacker runs): ``reply`` answers JSON,
    nothing is logged."""

    def reply(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: Any) -> None:
        return


@contextmanager
def http_peer(handler: type[JsonHandler],
              cert: tuple[Path, Path] | None = None) -> Iterator[http.server.HTTPServer]:
    """``handler`` served on a free 127.0.0.1 port (HTTPS with ``cert``), in a thread."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    if cert is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(*cert)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
