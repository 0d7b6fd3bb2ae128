"""The replay's outcome pinned to the bit: a fixed small replay (shared prefixes,
scaling up and down, a drain, the 8B preset with prefix caching) hashed. Any speed-up of
the replay or the simulator must leave this digest as it is: faster is fine, different
is not. (The digest was taken before the replay was optimised for ServeGen days, with
the weighted blend the replay then routed with, and the simulator's speed-up checked
against it; it was re-taken once, when routing moved to the EPP's own scheduler.)"""

from __future__ import annotations

import hashlib
import random

from epp.planner.core.types import Decision, Observation, Role
from epp.planner.offline.pool import PoolShape
from epp.planner.offline.replay import Run, replay
from epp.planner.offline.traces import Arrival
from epp.sim import presets


class Steps:
    """Asks for `targets[k]` replicas at its k-th decision."""

    name = "steps"
    interval_s = 20.0
    sample_interval_s = 2.0

    def __init__(self, targets: list[int]) -> None:
        self.targets, self.k = targets, 0

    def step(self, now: float, obs: Observation) -> Decision:
        n = self.targets[min(self.k, len(self.targets) - 1)]
        self.k += 1
        return Decision(at=now, targets={Role.AGGREGATED: n}, reason=f"step {self.k}")


def trace(n: int = 3000, seed: int = 3) -> list[Arrival]:
    rng = random.Random(seed)
    out, t = [], 0.0
    for _ in range(n):
        t += rng.expovariate(25.0 if (t // 40) % 2 == 0 else 8.0)
        group = rng.randrange(12)
        ids = tuple(range(100 * group, 100 * group + rng.randint(0, 6)))
        out.append(Arrival(t, len(ids) * 512 + rng.randint(1, 900), rng.randint(1, 400), ids))
    return out


def digest(run: Run) -> str:
    h = hashlib.sha256()
    for part in (run.served, run.lifetimes, run.actions, run.rejected):
        h.update(repr(part).encode())
    h.update(repr((run.lost, run.end, run.steps, run.last_arrival)).encode())
    return h.hexdigest()


def golden_run() -> Run:
    # The step-time parameters of the preset when the digest was taken, pinned so a
    # recalibration of the preset does not move the digest.
    sim = presets.config_for("llama-3.1-8b-h100", **PINNED_STEP)
    shape = PoolShape(sim, startup_s=30.0)
    return replay(trace(), Steps([3, 6, 2, 5, 1, 4, 4, 2]), shape, initial=2, seed=4)


PINNED_STEP = {"step_base_ms": 2.86, "prefill_ms_per_token": 0.045, "decode_ms_per_token": 0.045}
GOLDEN = "84067bfdae017ca788473b3a5141bf2311398b946ac18b14c4c129915dc3949c"


def test_a_fixed_replay_is_unchanged_to_the_bit():
    run = golden_run()
    assert len(run.served) + len(run.rejected) == 3000 and run.lost == 0
    assert len(run.actions) >= 5 and any(s.cached_tokens for s in run.served)
    assert digest(run) == GOLDEN
