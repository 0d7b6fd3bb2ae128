"""Model time: the simulator's one notion of "now", decoupled from the wall clock.

Every latency the simulator is configured with, and every duration it reports, is in
model seconds. Model time runs `scale` times faster than real time, so dividing each
sleep by `scale` speeds a whole simulation up (for tests) without changing a single
number it reports.
"""

from __future__ import annotations

import asyncio
import math
import time


class ModelClock:
    def __init__(self, scale: float = 1.0) -> None:
        if scale <= 0 or not math.isfinite(scale):
            raise ValueError("time scale must be a positive number")
        self.scale = scale

    def now(self) -> float:
        """Monotonic model seconds; only differences are meaningful."""
        return time.monotonic() * self.scale

    def to_real(self, model_seconds: float) -> float:
        return max(0.0, model_seconds) / self.scale

    async def sleep(self, model_seconds: float) -> None:
        # Always yield, even for zero: a step loop with zero-cost steps must not starve
        # the HTTP handlers that feed it.
        await asyncio.sleep(self.to_real(model_seconds))
