"""The ring of recent scheduling decisions behind the status page.

`DecisionRing.record` is a Director decision sink: it runs once per routed request on
the request loop, so it only appends a reference (the `SchedulingResult` already holds
each profile's `ScoreBreakdown`) to a bounded deque; nothing is copied or formatted
until the page polls (`rows`). Memory is bounded by `size` results and their endpoint
snapshots (measured cost: docs/BENCHMARKS.md, 'Status page: the decision ring').
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from epp.request import InferenceRequest
from epp.scheduling.types import ProfileResult, SchedulingResult

DEFAULT_SIZE = 50
# Endpoints listed per profile of one decision (best total first): the page stays small
# for a pool of hundreds.
MAX_ENDPOINTS_SHOWN = 8


class DecisionRing:
    def __init__(self, size: int = DEFAULT_SIZE, clock: Callable[[], float] = time.time) -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self._ring: deque[tuple[float, str, str, SchedulingResult]] = deque(maxlen=size)
        self._clock = clock
        self.total = 0  # decisions recorded since start (the ring keeps the last `size`)

    def record(self, request: InferenceRequest, result: SchedulingResult) -> None:
        self._ring.append((self._clock(), request.request_id, request.target_model, result))
        self.total += 1

    def rows(self) -> list[dict[str, Any]]:
        """The decisions newest first, as JSON-ready dicts."""
        return [_row(*entry) for entry in reversed(self._ring.copy())]

    def last_scores(self) -> dict[str, dict[str, Any]]:
        """Each endpoint's total in the newest decision that scored it, with the
        profile and the decision's time."""
        seen: dict[str, dict[str, Any]] = {}
        for at, _, _, result in reversed(self._ring.copy()):
            for profile, res in result.profile_results.items():
                b = res.breakdown if res is not None else None
                if b is None:
                    continue
                for e, total in zip(b.endpoints, b.totals, strict=True):
                    seen.setdefault(e.name, {"total": total, "profile": profile, "at": at})
        return seen


def _row(at: float, request_id: str, model: str, result: SchedulingResult) -> dict[str, Any]:
    return {
        "at": at,
        "request_id": request_id,
        "model": model,
        "primary_profile": result.primary_profile,
        "target": result.primary.targets[0].name,
        "headers": dict(result.headers),
        "profiles": {name: _profile(res) for name, res in result.profile_results.items()},
    }


def _profile(res: ProfileResult | None) -> dict[str, Any] | None:
    if res is None:
        return None
    out: dict[str, Any] = {"targets": [t.name for t in res.targets]}
    b = res.breakdown
    if b is None:
        return out
    order = sorted(range(len(b.endpoints)), key=lambda i: -b.totals[i])[:MAX_ENDPOINTS_SHOWN]
    out["scorers"] = [{"name": n, "weight": w} for n, w in b.scorers]
    out["endpoints"] = [
        {
            "name": b.endpoints[i].name,
            "total": round(b.totals[i], 4),
            "scores": [round(float(s[i]), 4) for s in b.scores],
        }
        for i in order
    ]
    out["candidates"] = len(b.endpoints)
    return out
