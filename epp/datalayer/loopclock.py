"""A clock that stands still while the EPP's own event loop is stalled.

Why: health is "the last good scrape is younger than --metrics-staleness-threshold".
Judged on the wall clock, a 2 s stall of the EPP's loop (a 28 MB body parsed on it, a
GC pause, a starved CPU) made every endpoint look stale at once, and every request
got 503 although no model server had done anything wrong. Staleness
must measure how long the *endpoint* has been silent while the EPP was able to listen.

`LoopClock.now()` is `time.monotonic()` minus the time the loop spent stalled: a
heartbeat task sleeps `tick` seconds at a time, and any lateness beyond `tick +
tolerance` counts as stall. A stall still in progress (the heartbeat not yet run) is
subtracted too, so code running right after a stall already sees the corrected time,
and the clock never jumps back when the heartbeat catches up. On a loop that is never
late the clock equals `time.monotonic()` (up to the tolerance per tick).

`now()` may be called from any thread (the scraper's thread stamps its scrapes with it):
the heartbeat's state is one tuple, replaced whole, so a reader never pairs a new stall
total with an old beat time (which would count one stall twice and move the clock back).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable


class LoopClock:
    def __init__(
        self,
        tick: float = 0.05,
        tolerance: float = 0.05,
        base: Callable[[], float] = time.monotonic,
    ) -> None:
        if not tick > 0 or tolerance < 0:
            raise ValueError(f"tick must be > 0 and tolerance >= 0, got {tick}, {tolerance}")
        self.tick = tick
        self.tolerance = tolerance
        self._base = base
        # (base() at the heartbeat's last run or None, seconds of stall accounted so far)
        self._state: tuple[float | None, float] = (None, 0.0)
        self._task: asyncio.Task[None] | None = None

    @property
    def stalled(self) -> float:
        """Seconds of stall accounted so far."""
        return self._state[1]

    def now(self) -> float:
        last, stalled = self._state
        t = self._base()
        if last is None:
            return t - stalled
        pending = max(0.0, t - last - self.tick - self.tolerance)
        return t - stalled - pending

    def beat(self) -> None:
        """One heartbeat (the task calls this every `tick`; tests may call it directly)."""
        t = self._base()
        last, stalled = self._state
        if last is not None:
            stalled += max(0.0, t - last - self.tick - self.tolerance)
        self._state = (t, stalled)

    def start(self) -> None:
        """Start the heartbeat on the running loop."""
        if self._task is None:
            self.beat()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="epp-loopclock")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
            self._state = (None, self._state[1])

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.tick)
            self.beat()
