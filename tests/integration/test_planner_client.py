"""The reference environment of the virtual connector (`epp planner-client`) over real
gRPC: a real VirtualConnector publishes decisions, the client carries them out with
real `epp sim` processes, writes the ready ones to an endpoints file (what `epp serve
--endpoints FILE` watches) and completes each decision. Nothing waits on a clock: each
step waits for the decision's completion (a deadline only bounds a broken run).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import pytest

from epp.harness.procs import pid_runs
from epp.planner.core.config import LiveParams
from epp.planner.core.types import Role
from epp.planner.live.connectors.reference_client import SimEnvironment, targets_of
from epp.planner.live.connectors.virtual import VirtualConnector

AGG, P, D = Role.AGGREGATED, Role.PREFILL, Role.DECODE


def test_a_published_decisions_counts_per_role():
    assert targets_of((AGG,), -1, 3) == {AGG: 3}  # aggregated travels in num_decode
    assert targets_of((P, D), 1, 2) == {P: 1, D: 2}
    assert targets_of((P, D), -1, 2) == {D: 2}  # -1: not set, left as is


async def completed(conn: VirtualConnector, decision_id: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while conn.board.scaled_decision_id < decision_id:
        assert time.monotonic() < deadline, f"decision {decision_id} never completed"
        await asyncio.sleep(0.05)


def listed(path) -> list[dict]:
    return json.loads(path.read_text())


def healthy(port: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
        return r.status == 200


async def test_the_client_carries_decisions_out_with_epp_sim_processes(tmp_path):
    conn = VirtualConnector((AGG,), "127.0.0.1:0")
    await conn.start()
    params = LiveParams(worker_command="epp sim --port {port}",
                        statefile=str(tmp_path / "state" / "{pool}.json"))  # fmt: skip
    env = SimEnvironment(f"127.0.0.1:{conn.port}", tmp_path / "pool.yaml", params, (AGG,),
                         drain_s=0.2)  # fmt: skip
    task = asyncio.ensure_future(env.run())
    try:
        await conn.set_targets({AGG: 2})  # decision 0
        await completed(conn, 0)
        two = listed(tmp_path / "pool.yaml")
        assert [e["name"] for e in two] == ["aggregated-0", "aggregated-1"]
        assert all(healthy(e["port"]) for e in two)  # listed only once they answer
        pids = {w.name: w.pid for w in env.connector.workers()}

        await conn.set_targets({AGG: 1})  # decision 1: the newest replica goes
        await completed(conn, 1)
        one = listed(tmp_path / "pool.yaml")
        assert [e["name"] for e in one] == ["aggregated-0"]
        assert not pid_runs(pids["aggregated-1"]) and pid_runs(pids["aggregated-0"])
        assert env.completed == [0, 1]
        assert conn.replicas()[AGG].ready == 1  # the planner sees it carried out
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await conn.stop()
    # the client's exit stops its replicas and empties the pool it published
    assert not pid_runs(pids["aggregated-0"])
    assert listed(tmp_path / "pool.yaml") == []
