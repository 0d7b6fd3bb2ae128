"""Every live decision, written down: one JSON line in `<log-dir>/decisions.jsonl` and
the planner gauges of `epp.observability` (replicas per role, predicted and observed
load, the decision's diagnostics such as correction factors, GPU-seconds held).

The line carries what was decided, why, and what the interval looked like, so a
decision can be checked afterwards without the EPP's logs. With the `tensorboard`
package installed, `log-dir` also gets TensorBoard event files (`tensorboard.py`), as
Dynamo's planner writes.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from epp.observability import (
    PLANNER_DECISIONS,
    PLANNER_DIAGNOSTIC,
    PLANNER_GPU_SECONDS,
    PLANNER_OBSERVED_REQUESTS,
    PLANNER_PREDICTED_REQUESTS,
    PLANNER_REPLICAS,
)
from epp.planner.core.types import Decision, Observation, Role, Stats
from epp.planner.live.tensorboard import open_writer, scalars

log = logging.getLogger("epp.planner")


def _num(x: float) -> float | None:
    return None if math.isnan(x) or math.isinf(x) else round(x, 6)


def _stats(s: Stats) -> dict[str, Any]:
    return {"count": s.count, "mean": _num(s.mean), "p90": _num(s.p90)}


def decision_line(decision: Decision, obs: Observation) -> dict[str, Any]:
    return {
        "at": decision.at,
        "interval": [obs.start, obs.end],
        "targets": {r.value: n for r, n in decision.targets.items()},
        "replicas": {
            r.value: {"ready": x.ready, "starting": x.starting, "draining": x.draining}
            for r, x in obs.replicas.items()
        },
        "drain": list(decision.drain),
        "reason": decision.reason,
        "predicted": {
            "requests": _num(decision.predicted.requests),
            "isl": _num(decision.predicted.isl),
            "osl": _num(decision.predicted.osl),
        },
        "observed": {
            "arrivals": obs.arrivals,
            "completions": obs.completions,
            "failures": obs.failures,
            "ttft_ms": _stats(obs.ttft_ms),
            "itl_ms": _stats(obs.itl_ms),
            "kv_mean": {r.value: _num(x.kv_mean) for r, x in obs.roles.items()},
            "queue_mean": {r.value: _num(x.queue_mean) for r, x in obs.roles.items()},
        },
        "diagnostics": {k: _num(v) for k, v in decision.diagnostics.items()},
    }


class DecisionRecorder:
    """Writes each decision to the JSONL log (if `log_dir`) and sets the gauges."""

    def __init__(self, log_dir: str | None, gpus_per_replica: Mapping[Role, int]) -> None:
        self.gpus = dict(gpus_per_replica)
        self.path = Path(log_dir) / "decisions.jsonl" if log_dir else None
        self._file: IO[str] | None = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())
        self._events = open_writer(self.path.parent) if self.path is not None else None
        if self.path is not None and self._events is None:
            log.info("planner: no tensorboard package, so %s gets no event files "
                     "(pip install 'epp[tensorboard]')", self.path.parent)  # fmt: skip

    def record(self, decision: Decision, obs: Observation) -> None:
        if self._file is not None:
            self._file.write(json.dumps(decision_line(decision, obs)) + "\n")
            self._file.flush()
        if self._events is not None:
            self._events.write(scalars(decision, obs, self.gpus))
        changed = False
        for role, n in decision.targets.items():
            have = obs.replicas_of(role)
            changed |= n != have.active
            PLANNER_REPLICAS.labels(role.value, "target").set(n)
            PLANNER_REPLICAS.labels(role.value, "ready").set(have.ready)
            PLANNER_REPLICAS.labels(role.value, "starting").set(have.starting)
            PLANNER_REPLICAS.labels(role.value, "draining").set(have.draining)
        PLANNER_DECISIONS.labels(str(changed).lower()).inc()
        PLANNER_PREDICTED_REQUESTS.set(decision.predicted.requests)
        PLANNER_OBSERVED_REQUESTS.set(obs.arrivals)
        for name, value in decision.diagnostics.items():
            PLANNER_DIAGNOSTIC.labels(name).set(value)
        held = sum(x.holding_gpus * self.gpus.get(r, 1) for r, x in obs.replicas.items())
        PLANNER_GPU_SECONDS.inc(held * max(0.0, obs.length_s))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._events is not None:
            self._events.close()
            self._events = None
