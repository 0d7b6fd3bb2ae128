"""`log-dir` also gets TensorBoard event files (seed 002): written by the decision
recorder through tensorboard's own writer, read back with tensorboard's own loader.
(`tensorboard` is an optional extra of epp and part of `dev`, so `make test` has it.)"""

from __future__ import annotations

import json
import math

from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.util.tensor_util import make_ndarray

from epp.planner.core.types import (
    Decision,
    Observation,
    PredictedLoad,
    Replicas,
    Role,
    RoleLoad,
    Stats,
)
from epp.planner.live.record import DecisionRecorder
from epp.planner.live.tensorboard import scalars

P, D = Role.PREFILL, Role.DECODE


def observation(arrivals: int, ttft: list[float]) -> Observation:
    return Observation(
        start=0.0, end=30.0, arrivals=arrivals, completions=len(ttft),
        ttft_ms=Stats.of(ttft),
        roles={P: RoleLoad(samples=30, queue_mean=3.5, kv_mean=0.2),
               D: RoleLoad(samples=30, queue_mean=0.0, kv_mean=0.6)},
        replicas={P: Replicas(ready=1), D: Replicas(ready=2, starting=1)},
    )  # fmt: skip


def test_scalars_leave_nan_out():
    d = Decision(at=30.0, targets={P: 2, D: 3}, reason="r")  # nothing predicted: NaN
    got = scalars(d, observation(0, []), {P: 1, D: 2})
    assert "predicted/requests" not in got and "observed/ttft_ms_mean" not in got
    # GPUs held: prefill 1 ready × 1 + decode (2 ready + 1 starting) × 2 = 7
    assert got["gpus"] == 7.0
    assert got["replicas/decode/starting"] == 1.0 and got["replicas/prefill/target"] == 2.0


def test_each_decision_is_one_event_read_back_by_tensorboard(tmp_path):
    rec = DecisionRecorder(str(tmp_path), {P: 1, D: 1})
    first = Decision(at=30.0, targets={P: 2, D: 3}, reason="prefill queue",
                     predicted=PredictedLoad(requests=120.0),
                     diagnostics={"p_correction": 1.5})  # fmt: skip
    rec.record(first, observation(100, [200.0, 400.0]))
    rec.record(Decision(at=60.0, targets={P: 2, D: 2}, reason="kv low"), observation(10, []))
    rec.close()
    (events_file,) = tmp_path.glob("events.out.tfevents.*")
    steps: dict[int, dict[str, float]] = {}
    # TensorBoard's loader moves simple_value into a scalar tensor, as TensorBoard reads it
    for event in EventFileLoader(str(events_file)).Load():
        if event.HasField("summary"):
            steps[event.step] = {
                v.tag: float(make_ndarray(v.tensor).item()) for v in event.summary.value
            }
    assert sorted(steps) == [0, 1]
    s0, s1 = steps[0], steps[1]
    assert s0["replicas/prefill/target"] == 2 and s0["replicas/decode/target"] == 3
    assert s0["replicas/decode/ready"] == 2 and s0["replicas/decode/starting"] == 1
    assert s0["observed/arrivals"] == 100 and s0["predicted/requests"] == 120
    assert s0["observed/ttft_ms_mean"] == 300  # (200 + 400) / 2
    assert s0["observed/ttft_ms_p90"] == 400  # nearest rank: ceil(0.9 × 2) = 2nd
    assert math.isclose(s0["observed/prefill/queue_mean"], 3.5)
    assert math.isclose(s0["observed/decode/kv_mean"], 0.6, rel_tol=1e-6)  # float32
    assert s0["diagnostics/p_correction"] == 1.5
    assert s1["replicas/decode/target"] == 2 and "observed/ttft_ms_mean" not in s1
    # the JSON lines are still written, one per decision
    lines = (tmp_path / "decisions.jsonl").read_text().splitlines()
    assert [json.loads(x)["reason"] for x in lines] == ["prefill queue", "kv low"]
