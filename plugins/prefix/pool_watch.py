"""Call a function after every pool membership change, between `start` and `stop`.

Both prefix indexes forget endpoints that leave the pool. Subscribing from inside the
event loop (at `start`) means the datastore calls back on that loop, never concurrently
with a scheduling cycle.
"""

from __future__ import annotations

from collections.abc import Callable

from epp.scheduling.registry import Handle


class PoolWatch:
    def __init__(self, handle: Handle, fn: Callable[[], None]) -> None:
        self.handle = handle
        self.fn = fn
        self._unsubscribe: Callable[[], None] | None = None

    def start(self) -> None:
        """Subscribe (inside the running loop); the server wires the Handle's pool first."""
        if self._unsubscribe is None:
            self._unsubscribe = self.handle.on_pool_change(self.fn)

    def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
