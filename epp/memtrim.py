"""Give freed request-body memory back to the OS soon after a burst of large bodies ends.

Why the EPP's resident memory stays up after held bodies are freed: each body arrives as
gRPC messages whose payloads become Python bytes objects of tens to hundreds of KiB.
CPython hands objects over 512 bytes to glibc malloc, which serves them from its heaps
(the main one and one arena per thread that allocates: gRPC's poller threads receive
the messages); freeing them puts the memory on malloc's free lists, and glibc returns
pages to the OS only from the top of a heap past M_TRIM_THRESHOLD, so memory freed below
a live allocation stays resident until reused. Its dynamic mmap threshold makes this
worse: after freeing one large mmapped buffer it raises the threshold (up to 32 MiB), so
later buffers of that size come from the heaps too. `malloc_trim(0)` walks every arena
and releases all whole free pages (madvise), wherever they are.

So the body budget calls `trim()` when large bodies it held are given back: at most once
per `MIN_INTERVAL` seconds and only after `MIN_FREED` bytes, so the cost (a walk of the
heaps, ~1 ms per 100 MiB, with the GIL released) is paid only after a burst. A no-op
where the C library has no malloc_trim (musl, macOS).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import time

MIN_FREED = 32 * 1024 * 1024
MIN_INTERVAL = 1.0


def _load() -> ctypes._NamedFuncPointer | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


_MALLOC_TRIM = _load()


class Trimmer:
    """Counts freed bytes; trims when enough were freed, at most once per `min_interval`
    (a trim due sooner is deferred to then on the running loop, never dropped: the last
    bodies of a burst are freed too)."""

    def __init__(self, min_freed: int = MIN_FREED, min_interval: float = MIN_INTERVAL) -> None:
        self.min_freed = min_freed
        self.min_interval = min_interval
        self.freed = 0
        self.last = -min_interval
        self.trims = 0
        self._pending: asyncio.TimerHandle | None = None

    def freed_bytes(self, n: int) -> None:
        self.freed += n
        if self.freed < self.min_freed or _MALLOC_TRIM is None or self._pending is not None:
            return
        wait = self.last + self.min_interval - time.monotonic()
        if wait <= 0:
            self.trim()
            return
        with contextlib.suppress(RuntimeError):  # no loop (streams driven by hand): later
            self._pending = asyncio.get_running_loop().call_later(wait, self.trim)

    def trim(self) -> None:
        self._pending = None
        self.last = time.monotonic()
        self.freed = 0
        self.trims += 1
        if _MALLOC_TRIM is not None:
            _MALLOC_TRIM(0)
