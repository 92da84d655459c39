from __future__ import annotations

import ctypes
import platform
import threading

import psutil
import pytest

from serving.runtime import memory

BLOCK = 64 * 1024  # below glibc's mmap threshold: served from an arena, not mmap'd
BLOCKS = 1600  # 100 MiB

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc" or
                                memory._malloc_trim() is None,
                                reason="malloc_trim is glibc's")


def rss() -> int:
    return int(psutil.Process().memory_info().rss)


@pytest.mark.parametrize("where", ["main thread", "worker thread"])
def test_trim_returns_freed_heap_memory_to_the_os(where: str) -> None:
    """What a dropped model leaves behind: 100 MiB freed inside a malloc arena, below a block
    still in use (so the arena cannot shrink from its top by itself). ``trim()`` hands it back.
    A model is loaded on a worker thread, whose allocations land in another arena."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    blocks: list[int] = []

    def allocate() -> None:
        for _ in range(BLOCKS):
            block = libc.malloc(BLOCK)
            assert block
            ctypes.memset(block, 1, BLOCK)  # touched: resident
            blocks.append(block)

    if where == "main thread":
        allocate()
    else:
        worker = threading.Thread(target=allocate)
        worker.start()
        worker.join()
    try:
        for block in blocks[:-1]:  # the last, topmost block stays in use
            libc.free(block)
        freed = (BLOCKS - 1) * BLOCK
        before = rss()
        assert memory.trim() is True
        returned = before - rss()
        print(f"{where}: trim returned {returned / 2**20:.1f} of {freed / 2**20:.1f} MiB freed")
        assert returned > freed * 0.8
    finally:
        libc.free(blocks[-1])
