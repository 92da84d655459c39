"""A WAN link in a box: a TCP proxy that delays every byte by a fixed time in each direction
(this kernel has no ``tc netem``). Order and throughput are kept: each direction is a queue of
(due time, chunk), written out when due.

    with DelayProxy(("10.77.1.30", 8100), delay_s=0.020, host="10.77.0.1") as proxy:
        ...  # connect to proxy.host:proxy.port: 20 ms each way added

It runs its own event loop in a thread; ``close()`` stops it and every connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass, field

CHUNK = 64 * 1024


@dataclass
class DelayProxy:
    target: tuple[str, int]
    delay_s: float = 0.020
    host: str = "127.0.0.1"
    port: int = 0  # 0: a free one, known after start()
    connections: int = 0
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _server: asyncio.base_events.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def start(self) -> DelayProxy:
        ready = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._accept, self.host, self.port))
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="delay-proxy", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the delay proxy did not start")
        return self

    async def _accept(self, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        for task in (self._pipe(reader, up_writer), self._pipe(up_reader, writer)):
            job = asyncio.ensure_future(task)
            self._tasks.add(job)
            job.add_done_callback(self._tasks.discard)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    with contextlib.suppress(OSError):
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()

        sender = asyncio.ensure_future(deliver())
        try:
            while True:
                data = await reader.read(CHUNK)
                await queue.put((time.monotonic() + self.delay_s, data))
                if not data:
                    break
            await sender
        except (OSError, asyncio.CancelledError):
            sender.cancel()
        finally:
            writer.close()

    def close(self) -> None:
        loop = self._loop
        if loop is None:
            return

        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        loop.close()
        self._loop = None

    def __enter__(self) -> DelayProxy:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.close()
