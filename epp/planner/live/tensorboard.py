"""The decisions as TensorBoard scalars in `log-dir`, beside decisions.jsonl, as seed
002's planner logs its load and worker counts to TensorBoard (`prefill_queue_size`,
`average_kv_load`, `num_prefill_workers`, `num_decode_workers`, `num_gpu`, ...).

Optional: needs the `tensorboard` package (`pip install 'epp[tensorboard]'`); without it
`open_writer` returns None and the recorder writes the JSON lines only. Scalars, one
point per decision (`step` = the decision's index, wall time = when it was written):

- `replicas/<role>/{target,ready,starting,draining}`, `gpus` (held when it decided);
- `observed/{arrivals,completions}`, `observed/{ttft_ms,itl_ms}_{mean,p90}`,
  `observed/<role>/{queue_mean,kv_mean}`;
- `predicted/{requests,isl,osl}`, `diagnostics/<name>` (correction factors, ...).

A NaN (no traffic, nothing predicted) is left out rather than plotted as 0.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from epp.planner.core.types import Decision, Observation, Role


def scalars(decision: Decision, obs: Observation, gpus: Mapping[Role, int]) -> dict[str, float]:
    """The tag → value pairs of one decision (NaN and inf left out)."""
    out: dict[str, float] = {}
    for role, n in decision.targets.items():
        have = obs.replicas_of(role)
        out[f"replicas/{role.value}/target"] = n
        out[f"replicas/{role.value}/ready"] = have.ready
        out[f"replicas/{role.value}/starting"] = have.starting
        out[f"replicas/{role.value}/draining"] = have.draining
    out["gpus"] = sum(x.holding_gpus * gpus.get(r, 1) for r, x in obs.replicas.items())
    out["observed/arrivals"] = obs.arrivals
    out["observed/completions"] = obs.completions
    for name, s in (("ttft_ms", obs.ttft_ms), ("itl_ms", obs.itl_ms)):
        out[f"observed/{name}_mean"] = s.mean
        out[f"observed/{name}_p90"] = s.p90
    for role, load in obs.roles.items():
        out[f"observed/{role.value}/queue_mean"] = load.queue_mean
        out[f"observed/{role.value}/kv_mean"] = load.kv_mean
    out["predicted/requests"] = decision.predicted.requests
    out["predicted/isl"] = decision.predicted.isl
    out["predicted/osl"] = decision.predicted.osl
    for name, value in decision.diagnostics.items():
        out[f"diagnostics/{name}"] = value
    return {k: float(v) for k, v in out.items() if math.isfinite(v)}


class EventWriter:
    """One TensorBoard event file in `log_dir` (tensorboard's own writer)."""

    def __init__(self, log_dir: str | Path) -> None:
        from tensorboard.compat.proto import summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._summary = summary_pb2
        self._writer = EventFileWriter(str(log_dir))
        self.step = 0

    def write(self, values: Mapping[str, float], wall_time: float | None = None) -> None:
        from tensorboard.compat.proto import event_pb2

        summary = self._summary.Summary(
            value=[self._summary.Summary.Value(tag=k, simple_value=v) for k, v in values.items()]
        )
        event = event_pb2.Event(
            wall_time=time.time() if wall_time is None else wall_time,
            step=self.step,
            summary=summary,
        )
        self._writer.add_event(event)
        self._writer.flush()
        self.step += 1

    def close(self) -> None:
        self._writer.close()


def open_writer(log_dir: str | Path) -> Any:
    """An EventWriter, or None when the tensorboard package is not installed."""
    try:
        import tensorboard.summary.writer.event_file_writer  # noqa: F401
    except ImportError:
        return None
    return EventWriter(log_dir)
