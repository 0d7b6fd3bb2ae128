"""Draining one endpoint without losing a request: a small state machine.

Scale-down picks a victim (`Decision.drain`); the connector takes it out of scheduling
at once (`Datastore.set_draining`: never picked again, its in-flight requests go on),
then calls `advance(now, inflight)` until it says `stop` (nothing in flight: stop the
process now) or `force_stop` (the drain timeout passed with work still in flight).
Dynamo's SIGTERM-then-kill drops in-flight requests on scale-down (#13559); waiting
for the EPP's own in-flight count to reach 0 is what makes "0 failed requests" hold.

Pure: the caller says what time it is and how much is in flight.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class DrainStep(StrEnum):
    KEEP = "keep"  # requests still in flight: look again later
    STOP = "stop"  # drained: stop the process
    FORCE_STOP = "force_stop"  # timeout with work in flight: stop anyway


@dataclass(slots=True)
class Drain:
    """One endpoint's drain, started at `started_at`, given up after `timeout_s`."""

    name: str
    started_at: float
    timeout_s: float
    last_inflight: int = -1
    outcome: DrainStep = DrainStep.KEEP

    def advance(self, now: float, inflight: int) -> DrainStep:
        """What to do now that `inflight` requests are left on the endpoint. Once it
        has said stop or force_stop it keeps saying so (a drain does not restart)."""
        if self.outcome is not DrainStep.KEEP:
            return self.outcome
        self.last_inflight = inflight
        if inflight <= 0:
            self.outcome = DrainStep.STOP
        elif now - self.started_at >= self.timeout_s:
            self.outcome = DrainStep.FORCE_STOP
        return self.outcome

    @property
    def done(self) -> bool:
        return self.outcome is not DrainStep.KEEP
