"""The SLA mode's damping: what limits and shapes a change of the sized count. The
items keep `sla_mode.py`'s numbering.

8. **Hysteresis and cooldown** (#9294), as a stabilization window
   (`scale-down-window`, the 300 s of Kubernetes HPA and AIBrix APA): scale up at
   once; scale down only to the largest target sized within the window, so a smaller
   target must hold for the whole window, and no scale-down comes sooner than the
   window after a scale-up. The sized target is already the smallest count
   predicted to meet the SLA with the whole load on it, which is the N−1 test of
   #9294 (the remaining replicas absorb the N/(N−1) load).
9. **Reversal guard** (`reversal-guard`):
   the window again, with the judge's boundary: a scale-down also waits until *more*
   than the guard has passed since the role last sized at its current count or above
   (`outcome.reversals` counts a change within 600 s, inclusive; a 600 s window lets
   the down through at exactly 600 s). At 600 no scale-up is ever reversed by a
   scale-down. It only limits scale-downs.
10. **Meeting rises** (each off by default unless an ablation chose it). A reactive forecast sees
   a rise one interval late and a new replica serves a start-up after that:
   - `rise-headroom` h: the forecast count plus h x the last interval's rise (when
     positive) x the horizon in intervals, the load the rise reaches by the time a
     replica asked for now is serving (a linear trend over the lead time, Holt's
     forecast with the trend taken from the last two intervals), at most the forecast
     again (a burst from silence is all rise: AIBrix APA's 2x cap on one step);
   A shorter decision interval than the window (`adjustment-interval: 30`) is the
   asymmetric scheme the HPA uses (scale-up with no stabilization, scale-down after its
   300 s window; KEDA polls every 30 s by default, the vLLM recipe every 15 s): the
   window and the guard are in seconds, so scale-downs keep their pace.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from epp.planner.core.types import Role


class Hysteresis:
    """The stabilization window and the reversal guard over each role's sized counts."""

    def __init__(self, roles: Sequence[Role], window: float, guard: float) -> None:
        self.roles = roles
        self.window = window
        self.guard = guard
        self.sized: dict[Role, deque[tuple[float, int]]] = {r: deque() for r in roles}
        self.seeded = False

    def apply(
        self, now: float, sized: Mapping[Role, int], have: Mapping[Role, int], start: float
    ) -> tuple[dict[Role, int], list[str]]:
        """Up at once; down only to the largest target sized within the window, not
        within the reversal guard of a scale-up. The
        first interval seeds the window with the count the planner found (at the
        interval's start), as the HPA does (`maybeInitScaleDownStabilizationWindow`,
        laws/hpa.py): a planner turned on does not scale down before it has a
        window's worth of its own targets."""
        out: dict[Role, int] = {}
        notes: list[str] = []
        window, guard = self.window, self.guard
        for r in self.roles:
            want, now_n = sized.get(r, 0), have.get(r, 0)
            recent = self.sized[r]
            if not self.seeded:
                recent.append((start, have.get(r, 0)))
            while recent and recent[0][0] <= now - window and recent[0][0] < now - guard:
                recent.popleft()
            recent.append((now, want))
            if want >= now_n:
                out[r] = want
                if want > now_n:
                    notes.append(f"{r.value} {now_n}->{want}")
                continue
            held = max((n for t, n in recent if t > now - window), default=0)
            guarded = max(n for t, n in recent if t >= now - guard)
            out[r] = min(now_n, max(held, guarded))
            if out[r] < now_n:
                notes.append(f"{r.value} {now_n}->{out[r]} (largest target in {window:g} s)")
            elif held >= now_n:
                notes.append(f"{r.value} wants {want}: held at {now_n} by the last {window:g} s")
            else:
                notes.append(
                    f"{r.value} wants {want}: held at {now_n}, sized so within {guard:g} s "
                    "(reversal guard)"
                )
        self.seeded = True
        if not notes:
            notes.append("no change")
        return out, notes


@dataclass
class Rise:
    """`rise-headroom`: the last interval's rise in requests (0 when it fell) and the
    load it adds to the forecast."""

    headroom_share: float
    rise: float = 0.0
    _prev: float | None = field(default=None, repr=False)

    def observe(self, arrivals: float) -> None:
        if self._prev is not None:
            self.rise = max(0.0, arrivals - self._prev)
        self._prev = float(arrivals)

    def headroom(self, point: float, horizon: int) -> float:
        """h x the rise x the horizon in intervals, at most the forecast again: one step
        never plans for more than twice the load (AIBrix APA's max-scale-up-rate 2x): a
        burst from silence is all rise, and x horizon it would size several bursts'
        worth."""
        return min(self.headroom_share * self.rise * horizon, point)
