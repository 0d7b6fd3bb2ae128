"""Tight requests in flight per endpoint, for the SLO scorers that weigh the harm a new
request does to them (`slo-externality-scorer`, `slo-tier-scorer`).

A request is recorded at its pick and dropped when its response is reported; a server
without the response path never reports, so an entry older than `max_age_s` is forgotten
at the next record (entries are kept in routing order, so expiry stops at the first young
one). Per endpoint the running sum of the entries' weights is kept, so a score reads it
in O(1).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass


@dataclass(slots=True)
class _Entry:
    endpoint: str
    weight: float
    routed_at: float


class TightLedger:
    def __init__(self, max_age_s: float) -> None:
        self.max_age_s = max_age_s
        self.entries: dict[str, _Entry] = {}  # request id -> entry, oldest first
        self.weight: dict[str, float] = defaultdict(float)  # endpoint -> Σ weights

    def record(self, request_id: str, endpoint: str, weight: float, now: float) -> None:
        self.expire(now)
        self.drop(request_id)
        self.entries[request_id] = _Entry(endpoint, weight, now)
        self.weight[endpoint] += weight

    def drop(self, request_id: str) -> None:
        e = self.entries.pop(request_id, None)
        if e is not None:
            left = self.weight[e.endpoint] - e.weight
            self.weight[e.endpoint] = left if left > 1e-12 else 0.0

    def expire(self, now: float) -> None:
        horizon = now - self.max_age_s
        while self.entries:
            rid, e = next(iter(self.entries.items()))
            if e.routed_at >= horizon:
                return
            self.drop(rid)

    def on(self, endpoint: str) -> float:
        """The weight of the tight requests in flight on `endpoint`."""
        return self.weight.get(endpoint, 0.0)
