"""A byte-rate limit shared by the transfers that pass it: a token bucket that goes into debt.

A transfer takes the bytes it has just sent or received and sleeps while the bucket is below
zero, so many transfers together keep to the rate and one large chunk only delays the next.
Written here rather than taken from ``aiolimiter``: that refuses an amount larger than the
bucket, and chunk sizes and rates are both settings.
"""

from __future__ import annotations

import asyncio
import time


class Rate:
    def __init__(self, mbit_s: float, burst_s: float = 0.5) -> None:
        self.bytes_s = mbit_s * 1e6 / 8
        self.burst = self.bytes_s * burst_s
        self.tokens = self.burst
        self.last = time.monotonic()

    async def take(self, n: int) -> None:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.bytes_s) - n
        self.last = now
        if self.tokens < 0:
            await asyncio.sleep(-self.tokens / self.bytes_s)


def rate(mbit_s: float) -> Rate | None:
    """A limit of ``mbit_s`` (None for 0: no limit)."""
    return Rate(mbit_s) if mbit_s > 0 else None
