"""The virtual connector's decision rules (Dynamo `virtual_connector.py`, reference
§6.1), pure so they can be tested on a made-up clock:

1. counts equal to the stored ones: "No scaling needed", nothing published;
2. the environment is ready for a new decision when there is none yet or it completed
   the last (`scaled_decision_id >= decision_id`);
3. not ready: the new decision is **skipped**, until `max_wait_s` (1800 s) have passed
   since the first skip; then it proceeds anyway;
4. publishing writes the counts and `decision_id` (0 for the first, then +1).

-1 means "not set", as in Dynamo's `PlannerDecision`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

MAX_WAIT_S = 1800.0  # Dynamo's SCALING_MAX_WAIT_TIME default


class Outcome(StrEnum):
    UNCHANGED = "unchanged"
    SKIPPED = "skipped"
    PUBLISHED = "published"


@dataclass(frozen=True, slots=True)
class Published:
    num_prefill_workers: int = -1
    num_decode_workers: int = -1
    decision_id: int = -1


class DecisionBoard:
    def __init__(self, max_wait_s: float = MAX_WAIT_S) -> None:
        self.max_wait_s = max_wait_s
        self.current = Published()
        self.scaled_decision_id = -1
        self.completed = Published()  # the last decision the environment carried out
        self._first_skip: float | None = None

    @property
    def ready(self) -> bool:
        return self.current.decision_id < 0 or self.scaled_decision_id >= self.current.decision_id

    def update(self, now: float, num_prefill: int, num_decode: int) -> Outcome:
        c = self.current
        if (num_prefill, num_decode) == (c.num_prefill_workers, c.num_decode_workers):
            return Outcome.UNCHANGED
        if not self.ready:
            if self._first_skip is None:
                self._first_skip = now
            if now - self._first_skip < self.max_wait_s:
                return Outcome.SKIPPED
        self._first_skip = None
        self.current = Published(num_prefill, num_decode, c.decision_id + 1)
        return Outcome.PUBLISHED

    def complete(self, decision_id: int) -> int:
        """The environment carried out `decision_id`; returns `scaled_decision_id`.
        An id not yet published, or older than the last completed one, changes nothing."""
        if self.scaled_decision_id < decision_id <= self.current.decision_id:
            self.scaled_decision_id = decision_id
            if decision_id == self.current.decision_id:
                self.completed = self.current
        return self.scaled_decision_id
