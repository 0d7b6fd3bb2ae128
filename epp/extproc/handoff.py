"""Routed requests waiting for their observer stream (`epp serve --response-path observer`).

In observer mode Envoy runs two ext_proc filters (deploy/envoy/envoy-observer.yaml): the
first routes and skips the response; the second, in `observability_mode`, opens its own
gRPC stream with the request's headers (as the first filter left them) and then the
response. The routing stream tags the upstream request with `x-epp-route-id` and leaves
its `ResponseLeg` here; the observer stream claims it by that id and owns it from then on.

Never leaking: a leg nobody claims is ended (`complete=False`: in-flight given back, an
incomplete record) once it is older than `join_timeout`. Envoy opens the observer stream
as soon as the routed request's headers reach the second filter, right after the first
filter's answer (0-4 ms measured on loopback, docs/ARCHITECTURE.md); the wait can only be
a new HTTP/2 connection to the EPP, which Envoy's ext_proc cluster bounds by its
`connect_timeout` (5 s), or this loop stalling. Twice that is `JOIN_TIMEOUT`. A request
that loses its observer (client gone before the second filter saw it, observer stream
refused, or sent to another EPP replica) so stays counted at most 10 s; a claimed leg is
ended by its observer stream, whose end Envoy bounds (deferred close, 5 s after the HTTP
stream ends, whatever way it ended).

The id is `<replica nonce>.<counter>`: unique per process, so a client cannot guess a
live one from another request (and client-sent values are removed before routing); the
nonce lets an observer stream tell "routed by another replica" from "unknown or expired".
Each outcome is counted in `epp_response_observer_joins_total{outcome}`.

The access-log response path (`--response-path log`, epp/extproc/access_log.py) parks its
legs here too (`claimant="log"`): there the claim is the request's access-log entry, which
comes when the response has ended; Envoy logs a request that is still running again every
few seconds (an intermediate entry), which `touch`es its leg, so the timeout
(`--response-log-timeout`) counts from the last sign of life, not from routing. The
outcomes go to `epp_response_log_entries_total`.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from itertools import count
from typing import Literal

from prometheus_client import Counter

from epp.extproc.response_leg import ResponseLeg
from epp.observability import OBSERVER_JOINS, RESPONSE_LOG_ENTRIES

# Twice the ext_proc cluster's connect_timeout (deploy/envoy/envoy.yaml): see above.
JOIN_TIMEOUT = 10.0

# Who claims the parked legs: the observer stream, or Envoy's access-log entry at the
# response's end (epp/extproc/access_log.py), each counted in its own metric.
Claimant = Literal["observer", "log"]
_COUNTERS: dict[str, Counter] = {"observer": OBSERVER_JOINS, "log": RESPONSE_LOG_ENTRIES}


class RouteTable:
    """Unclaimed legs by route id, oldest first (insertion order = routing order, so the
    sweep stops at the first young one)."""

    def __init__(
        self,
        join_timeout: float = JOIN_TIMEOUT,
        clock: Callable[[], float] = time.monotonic,
        claimant: Claimant = "observer",
    ) -> None:
        if not join_timeout > 0:
            raise ValueError(f"join_timeout must be > 0 seconds, got {join_timeout}")
        self.join_timeout = join_timeout
        self.claimant = claimant
        counter = _COUNTERS[claimant]
        self._joined, self._expired, self._foreign, self._unknown = (
            counter.labels(outcome=o) for o in ("joined", "expired", "foreign", "unknown")
        )
        self.clock = clock
        self.nonce = secrets.token_hex(6)
        self._ids = count(1)
        self._legs: OrderedDict[str, tuple[float, ResponseLeg]] = OrderedDict()
        self.claimed = 0
        self.expired = 0
        self.foreign = 0  # observer streams or log entries for another replica's route ids
        self.unknown = 0  # observer streams or log entries without a (live) id of ours

    def __len__(self) -> int:
        return len(self._legs)

    def put(self, leg: ResponseLeg) -> str:
        """Park `leg`; returns the id to send upstream in `x-epp-route-id`."""
        route_id = f"{self.nonce}.{next(self._ids)}"
        self._legs[route_id] = (self.clock(), leg)
        return route_id

    def claim(self, route_id: str | None) -> ResponseLeg | None:
        """The leg parked under `route_id`, now the caller's (None: not ours, or gone)."""
        entry = self._legs.pop(route_id, None) if route_id else None
        if entry is not None:
            self.claimed += 1
            self._joined.inc()
            return entry[1]
        if route_id and not route_id.startswith(self.nonce + "."):
            self.foreign += 1
            self._foreign.inc()
        else:
            self.unknown += 1
            self._unknown.inc()
        return None

    def touch(self, route_id: str) -> ResponseLeg | None:
        """The leg's request is still running (Envoy's periodic access-log entry): its
        timeout starts again. Returns the leg, still parked (None: not parked here)."""
        entry = self._legs.pop(route_id, None)
        if entry is None:
            return None
        self._legs[route_id] = (self.clock(), entry[1])  # to the end: the sweep's order holds
        return entry[1]

    def take_back(self, route_id: str) -> ResponseLeg | None:
        """The routing stream takes its own leg back (the response came to it after all:
        `stream.py`); not a join, so not counted."""
        entry = self._legs.pop(route_id, None)
        return entry[1] if entry is not None else None

    def sweep(self) -> float | None:
        """End every leg older than `join_timeout`; returns when the next one expires
        (on `clock`), None when none is left."""
        now = self.clock()
        while self._legs:
            route_id, (parked, leg) = next(iter(self._legs.items()))
            if now - parked < self.join_timeout:
                return parked + self.join_timeout
            del self._legs[route_id]
            self.expired += 1
            self._expired.inc()
            leg.end(complete=False)
        return None
