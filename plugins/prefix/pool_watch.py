"""Call a function after every pool membership change, on the event loop's thread.

Both prefix indexes forget endpoints that leave the pool. The index is touched by every
scheduling cycle on the event loop, so a change reported from another thread is handed
to the loop rather than run concurrently with a cycle (as the metrics scraper does).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from epp.scheduling.registry import Handle


class PoolWatch:
    def __init__(self, handle: Handle, fn: Callable[[], None]) -> None:
        self.handle = handle
        self.fn = fn
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: int | None = None
        self._unsubscribe: Callable[[], None] | None = None

    def start(self) -> None:
        """Subscribe (inside the running loop); the server wires the Handle's pool first."""
        if self._unsubscribe is None:
            self._loop = asyncio.get_running_loop()
            self._thread = threading.get_ident()
            self._unsubscribe = self.handle.on_pool_change(self._changed)

    def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def _changed(self) -> None:
        if self._loop is not None and threading.get_ident() != self._thread:
            self._loop.call_soon_threadsafe(self.fn)
        else:
            self.fn()
