"""The local connector with real `epp sim` processes: an EPP that dies without cleaning
up is replaced by one that adopts its replicas (same pids, same ports, nothing started
twice), forgets the dead ones, and starting replicas are cancelled before ready ones
are drained."""

from __future__ import annotations

import subprocess
from pathlib import Path

from epp.datastore import Datastore
from epp.planner.core.config import load_planner_file
from epp.planner.core.types import Role
from epp.planner.live.connectors.local import LocalConnector
from epp.planner.live.connectors.statefile import WorkerRecord, decode, encode

AGG = Role.AGGREGATED


def live(tmp: Path):
    text = (
        'worker-command: "epp sim --port {port}"\n'
        f'statefile: "{tmp}/state/{{pool}}.json"\n'
        "worker-ready-timeout: 60\ndrain-timeout: 30\n"
    )
    return load_planner_file(text).live


def gone(pid: int) -> bool:
    """Exited (a zombie of ours has no command line any more)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes() == b""
    except FileNotFoundError:
        return True


async def test_a_restarted_epp_adopts_live_replicas_and_forgets_dead_ones(tmp_path):
    params = live(tmp_path)
    first = LocalConnector(Datastore(require_metrics=False), params, [AGG], pool="p")
    await first.start()
    await first.set_replicas(AGG, 2)
    await first.settle()
    started = {w.name: w for w in first.workers()}
    assert first.replicas()[AGG].ready == 2
    popens = [w.popen for w in first._workers.values()]
    # The EPP "dies": no stop(), its replicas keep running. Add a record of a process
    # that has exited, as a crash between a replica's death and the next save leaves.
    dead = subprocess.Popen(["true"])
    dead.wait()
    statefile = tmp_path / "state" / "p.json"
    records = decode(statefile.read_text())
    stale = WorkerRecord("aggregated-7", AGG, 1, dead.pid, ("epp", "sim", "--port", "1"))
    statefile.write_text(encode([*records, stale]))
    await first._session.close()

    ds = Datastore(require_metrics=False)
    second = LocalConnector(ds, params, [AGG], pool="p")
    await second.start()
    try:
        adopted = {w.name: w for w in second.workers()}
        assert adopted == started  # same names, pids, ports, commands; the stale one dropped
        assert second.replicas()[AGG].ready == 2
        assert {(e.name, e.port) for e in ds.endpoints()} == {
            (w.name, w.port) for w in started.values()
        }
        assert [w.name for w in decode(statefile.read_text())] == sorted(started)
        # a new replica is numbered after every recorded one (aggregated-7 included),
        # so names never collide with an adopted worker's log
        await second.set_replicas(AGG, 3)
        await second.settle()
        assert "aggregated-8" in second.ready_names()
    finally:
        await second.stop()
    for p in popens:  # the first EPP's children: stopped by the second, reaped here
        assert p.wait(timeout=10) is not None
    assert all(gone(w.pid) for w in started.values())
    assert decode(statefile.read_text()) == []


async def test_scale_down_cancels_a_starting_replica_before_draining_a_ready_one(tmp_path):
    params = live(tmp_path)
    ds = Datastore(require_metrics=False)
    conn = LocalConnector(ds, params, [AGG], pool="q")
    await conn.start()
    try:
        await conn.set_replicas(AGG, 1)
        await conn.settle()
        [ready] = conn.ready_names()
        await conn.set_replicas(AGG, 2)  # one starting now
        assert conn.replicas()[AGG].starting == 1
        await conn.set_replicas(AGG, 1)
        # the starting one was cancelled at once; the ready one never left the pool
        assert conn.replicas()[AGG].starting == 0
        assert conn.ready_names() == {ready}
        assert [e.name for e in ds.endpoints()] == [ready]
        assert not ds.snapshot()[0].draining
    finally:
        await conn.stop()
