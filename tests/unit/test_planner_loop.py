"""The planner thread's hand-overs: records and admissions cross from the request loop
through the bounded queue into the interval, pool samples are taken every pulling
interval, the decision is carried out on the server's loop (not the planner thread),
`no-operation` carries nothing out, and each decision is one JSONL line.

The connector here is an in-memory pool satisfying `connectors.base.Connector` (the
real local connector runs in tests/e2e/test_planner_loop.py with `epp sim` processes);
the policy records the observations it is given."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Sequence

from epp.datastore import Datastore, Endpoint, EndpointMetrics
from epp.observability import REGISTRY
from epp.planner.core.types import Decision, Observation, Replicas, Role
from epp.planner.core.window import RequestRecord
from epp.planner.live.loop import ManualTicks, PlannerThread
from epp.planner.live.record import DecisionRecorder

AGG = Role.AGGREGATED


class MemoryPool:
    def __init__(self, ready: Sequence[str]) -> None:
        self.ready = list(ready)
        self.calls: list[tuple[Role, int, tuple[str, ...], str]] = []

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def replicas(self):
        return {AGG: Replicas(ready=len(self.ready))}

    def ready_names(self) -> frozenset[str]:
        return frozenset(self.ready)

    async def set_replicas(self, role: Role, n: int, prefer_drain: Sequence[str] = ()) -> None:
        self.calls.append((role, n, tuple(prefer_drain), threading.current_thread().name))

    async def drain(self, name: str) -> None: ...


class Recording:
    """A policy that wants one replica more than it sees, and keeps what it was shown."""

    name = "recording"
    interval_s = 2.0
    sample_interval_s = 1.0

    def __init__(self) -> None:
        self.seen: list[Observation] = []

    def step(self, now: float, obs: Observation) -> Decision:
        self.seen.append(obs)
        n = obs.replicas_of(AGG).ready
        return Decision(at=now, targets={AGG: n + 1}, reason="one more", drain=("e1",))


def setup(tmp_path, *, no_operation: bool = False, queue_cap: int = 1000):
    ds = Datastore(require_metrics=False)
    ds.set_endpoints([Endpoint(n, "127.0.0.1", 9000 + i) for i, n in enumerate(["e0", "e1"])])
    ds.update_metrics("e0", EndpointMetrics(waiting_queue_size=3, kv_cache_usage=0.5))
    ds.update_metrics("e1", EndpointMetrics(waiting_queue_size=1, kv_cache_usage=0.1))
    pool, policy, ticks = MemoryPool(["e0", "e1"]), Recording(), ManualTicks()
    recorder = DecisionRecorder(str(tmp_path), {AGG: 1})
    thread = PlannerThread(policy, ds, pool, asyncio.get_running_loop(), ticks, recorder,
                           no_operation=no_operation, queue_cap=queue_cap)  # fmt: skip
    thread.start()
    return ds, pool, policy, ticks, thread


def record(isl: int) -> RequestRecord:
    return RequestRecord(finished_at=0.0, isl=isl, osl=10, ttft_ms=50.0, itl_ms=5.0,
                         duration_s=0.1, endpoint="e0", role=AGG, status=200)  # fmt: skip


async def test_an_interval_gathers_what_the_request_loop_saw(tmp_path):
    _, pool, policy, ticks, thread = setup(tmp_path)
    try:
        for isl in (10, 20, 30):
            thread.on_admit(isl)
        thread.on_record(record(10))
        thread.on_record(record(20))
        for now in (0.0, 1.0, 2.0):  # opens + samples, samples, samples + decides
            await asyncio.to_thread(ticks.advance, now)
        [obs] = policy.seen
        assert (obs.start, obs.end) == (0.0, 2.0)
        assert (obs.arrivals, obs.completions) == (3, 2)
        assert obs.isl.mean == 15.0  # (10 + 20) / 2 completed
        # three samples of (waiting 3 + 1 = 4, KV (0.5 + 0.1) / 2 = 0.3) over 2 replicas
        load = obs.role(AGG)
        assert load.samples == 3 and load.queue_mean == 4 and abs(load.kv_mean - 0.3) < 1e-9
        assert obs.replicas_of(AGG) == Replicas(ready=2)
        assert {e.name for e in obs.endpoints} == {"e0", "e1"}
        await asyncio.wrap_future(thread.last_apply)
        # carried out on the server's loop (this test's thread), not the planner thread
        assert pool.calls == [(AGG, 3, ("e1",), threading.current_thread().name)]
        line = json.loads((tmp_path / "decisions.jsonl").read_text())
        assert line["targets"] == {"aggregated": 3} and line["reason"] == "one more"
        assert line["observed"]["arrivals"] == 3
    finally:
        await asyncio.to_thread(thread.stop)


async def test_no_operation_decides_and_records_but_changes_nothing(tmp_path):
    _, pool, policy, ticks, thread = setup(tmp_path, no_operation=True)
    try:
        for now in (0.0, 1.0, 2.0, 3.0, 4.0):
            await asyncio.to_thread(ticks.advance, now)
        assert len(policy.seen) == 2 and thread.last_apply is None and pool.calls == []
        assert len((tmp_path / "decisions.jsonl").read_text().splitlines()) == 2
    finally:
        await asyncio.to_thread(thread.stop)


async def test_the_hand_over_queue_is_bounded(tmp_path, caplog):
    _, _, policy, ticks, thread = setup(tmp_path, queue_cap=5)
    before = REGISTRY.get_sample_value("epp_planner_observations_dropped_total") or 0.0
    try:
        for _ in range(8):
            thread.on_admit(1)
        assert thread.dropped == 3  # 8 offered, 5 fit
        dropped = REGISTRY.get_sample_value("epp_planner_observations_dropped_total")
        assert dropped == before + 3
        with caplog.at_level(logging.WARNING, logger="epp.planner"):
            for now in (0.0, 1.0, 2.0):
                await asyncio.to_thread(ticks.advance, now)
        assert policy.seen[0].arrivals == 5
        assert [r for r in caplog.records if "3 admissions/finished requests dropped" in r.message]
    finally:
        await asyncio.to_thread(thread.stop)


async def test_a_failing_step_does_not_end_the_thread(tmp_path):
    _, _, policy, ticks, thread = setup(tmp_path)

    def broken(now, obs):
        raise RuntimeError("boom")

    policy.step = broken
    try:
        for now in (0.0, 1.0, 2.0, 3.0):
            await asyncio.to_thread(ticks.advance, now)  # would time out if the thread died
        assert thread._thread.is_alive()
    finally:
        await asyncio.to_thread(thread.stop)
