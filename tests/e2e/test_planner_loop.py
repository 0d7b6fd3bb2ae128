"""The planner in the loop, end to end with real processes: `epp serve` (in-process
`EppServer` with `--planner`), real `epp sim` replicas the local connector starts and
stops, and a real Envoy in front. Ticks are given by hand (`ManualTicks`), so the
test decides when an interval closes; nothing depends on how fast the machine is.

The planner file uses mode `load` with low KV thresholds: an aggregated replica's load
is `kv_mean + 0.02 × waiting per replica` (seed 002). With `--max-num-seqs 2` and 16
requests kept in flight, ~14 wait on one replica: 0.02 × 14 = 0.28 > 0.15, so it
scales up; idle gives 0 < 0.05, so it scales down to min-endpoint 1.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import aiohttp
import pytest

from epp.harness.envoy import EnvoyOptions, astart_envoy
from epp.harness.procs import ProcessGroup
from epp.planner.core.config import load_planner_file
from epp.planner.core.types import Role
from epp.planner.live.connectors.local import LocalConnector
from epp.planner.live.loop import ManualTicks
from epp.serve import EppServer, ServeOptions
from tests.eventually import eventually

# Replicas start, get scraped and take load: the deadline only bounds a broken run.
WAIT_S = 60.0

SIM = "epp sim --port {port} --max-num-seqs 2 --decode-ms-per-token 4 --prefill-ms-per-token 0.01"
AGG = Role.AGGREGATED


def planner_file(tmp: Path, **extra: object) -> str:
    keys = {
        "mode": "load",
        "adjustment-interval": 2,
        "metric-pulling-interval": 1,
        "min-endpoint": 1,
        "max-gpu-budget": 3,
        "decode-kv-scale-up-threshold": 0.15,
        "decode-kv-scale-down-threshold": 0.05,
        "worker-command": SIM,
        "worker-ready-timeout": 60,
        "drain-timeout": 60,
        "statefile": str(tmp / "state" / "{pool}.json"),
        "log-dir": str(tmp / "log"),
        **extra,
    }
    return "\n".join(f"{k}: {json.dumps(v)}" for k, v in keys.items())


class Load:
    """`concurrency` clients sending streaming completions back to back until stopped;
    every status is kept."""

    def __init__(self, url: str, concurrency: int, max_tokens: int = 60) -> None:
        self.url, self.concurrency, self.max_tokens = url, concurrency, max_tokens
        self.statuses: list[int] = []
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task] = []

    async def _client(self, session: aiohttp.ClientSession, i: int) -> None:
        body = {"model": "tiny", "prompt": f"client {i} says hello", "stream": True,
                "max_tokens": self.max_tokens, "ignore_eos": True}  # fmt: skip
        while not self._stop.is_set():
            async with session.post(self.url + "/v1/completions", json=body) as r:
                await r.read()
                self.statuses.append(r.status)

    async def __aenter__(self) -> Load:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120))
        self._tasks = [asyncio.create_task(self._client(self._session, i))
                       for i in range(self.concurrency)]  # fmt: skip
        return self

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)
        await self._session.close()

    async def __aexit__(self, *exc: object) -> None:
        if not self._stop.is_set():
            await self.stop()


@pytest.fixture
async def stack(tmp_path):
    """EppServer with the planner + Envoy; yields (server, ticks, envoy url)."""
    cfg = load_planner_file(planner_file(tmp_path), "planner.yaml")
    opts = ServeOptions(host="127.0.0.1", grpc_port=0, health_port=0, metrics_port=0,
                        planner=cfg, pool_name="e2e")  # fmt: skip
    ticks = ManualTicks()
    server = EppServer(opts, planner_ticks=ticks)
    await server.start()
    pg = ProcessGroup()
    try:
        envoy_opts = EnvoyOptions.loopback(server.grpc_port, server.health_port)
        envoy = await astart_envoy(pg, envoy_opts, timeout=60)
        yield server, ticks, envoy.url
    finally:
        await pg.aclose()
        await server.stop()


def connector(server: EppServer) -> LocalConnector:
    assert server.planner is not None
    c = server.planner.connector
    assert isinstance(c, LocalConnector)
    return c


def healthy_count(server: EppServer) -> int:
    return sum(s.healthy and not s.draining for s in server.datastore.snapshot())


async def interval(server: EppServer, ticks: ManualTicks, t: list[float]) -> None:
    """Two ticks (sample, then sample + decide: interval 2, pulling 1), then wait for
    the connector to carry the decision out."""
    for _ in range(2):
        t[0] += 1.0
        await asyncio.to_thread(ticks.advance, t[0])
    planner = server.planner
    assert planner is not None
    if planner.last_apply is not None:
        await asyncio.wrap_future(planner.last_apply)
    await connector(server).settle()


async def test_ramp_scales_up_idle_scales_down_and_a_drain_loses_nothing(stack, tmp_path):
    server, ticks, url = stack
    conn = connector(server)
    t = [0.0]
    # min-endpoint 1: the connector started one replica before the thread started
    await conn.settle()
    assert conn.replicas()[AGG].ready == 1
    await eventually(
        lambda: healthy_count(server) == 1, "the first replica to be scraped", timeout=WAIT_S
    )

    async with Load(url, concurrency=16) as load:
        await eventually(
            lambda: sum(s.metrics.waiting_queue_size for s in server.datastore.snapshot()) >= 8,
            "a queue to form",
            timeout=WAIT_S,
        )
        await asyncio.to_thread(ticks.advance, t[0])  # the first tick opens the window
        # ramp: one interval under load → +1 (load mode moves ±1 per interval)
        await interval(server, ticks, t)
        decision = server.planner.decisions[-1]
        assert decision.target(AGG) == 2, decision.reason
        assert conn.replicas()[AGG].ready == 2
        await eventually(
            lambda: healthy_count(server) == 2, "the new replica to be scraped", timeout=WAIT_S
        )
        await eventually(
            lambda: len(load.statuses) >= 40, "traffic on two replicas", timeout=WAIT_S
        )

        # scale-down under load: the victim has requests in flight when its drain starts
        victim = max(conn.ready_names(), key=lambda n: server.datastore.inflight(n)[0])
        busy = server.datastore.inflight(victim)[0]
        assert busy > 0
        pid = next(w.pid for w in conn.workers() if w.name == victim)
        await conn.set_replicas(AGG, 1, prefer_drain=[victim])
        assert conn.replicas()[AGG].draining == 1
        await conn.settle()
        assert victim not in conn.ready_names()
        assert server.datastore.get(victim) is None
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        before = len(load.statuses)
        await eventually(
            lambda: len(load.statuses) >= before + 20, "traffic after the drain", timeout=WAIT_S
        )
        await load.stop()
    # every request of the ramp and the drain under load succeeded
    assert load.statuses and set(load.statuses) == {200}, sorted(set(load.statuses))

    # idle: back to min-endpoint (it is at 1 already after the manual drain; scale up
    # by hand to 2, then let the planner bring it down). Load mode's decode grace period
    # blocks scale-down for 2 evaluated intervals after its scale-up, and an interval
    # whose ready count changed is skipped, so allow a few intervals.
    await conn.set_replicas(AGG, 2)
    await conn.settle()
    assert conn.replicas()[AGG].ready == 2
    for _ in range(6):
        await interval(server, ticks, t)
        if conn.replicas()[AGG].active == 1:
            break
    assert conn.replicas()[AGG].ready == 1, [d.reason for d in server.planner.decisions]
    assert server.planner.decisions[-1].target(AGG) == 1

    # the decision log has one line per decision, with targets and reasons
    lines = (tmp_path / "log" / "decisions.jsonl").read_text().splitlines()
    assert len(lines) == len(server.planner.decisions)
    first = json.loads(lines[0])
    assert first["targets"] == {"aggregated": 2} and first["observed"]["arrivals"] > 0


async def test_stop_leaves_no_worker_running(tmp_path):
    cfg = load_planner_file(planner_file(tmp_path, **{"min-endpoint": 2}), "planner.yaml")
    opts = ServeOptions(host="127.0.0.1", grpc_port=0, health_port=0, metrics_port=0,
                        planner=cfg, pool_name="stop")  # fmt: skip
    server = EppServer(opts, planner_ticks=ManualTicks())
    await server.start()
    conn = connector(server)
    await conn.settle()
    pids = [w.pid for w in conn.workers()]
    assert len(pids) == 2 and conn.replicas()[AGG].ready == 2
    await server.stop()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    state = json.loads((tmp_path / "state" / "stop.json").read_text())
    assert state["workers"] == []


async def zero_stack(tmp_path, pool: str, **extra: object):
    keys = {"min-endpoint": 0, "min-gpu-budget": 0, **extra}
    cfg = load_planner_file(planner_file(tmp_path, **keys), "planner.yaml")
    opts = ServeOptions(host="127.0.0.1", grpc_port=0, health_port=0, metrics_port=0,
                        planner=cfg, pool_name=pool)  # fmt: skip
    server = EppServer(opts, planner_ticks=ManualTicks())
    await server.start()
    pg = ProcessGroup()
    envoy_opts = EnvoyOptions.loopback(server.grpc_port, server.health_port)
    try:
        envoy = await astart_envoy(pg, envoy_opts, timeout=60)
    except BaseException:
        await pg.aclose()
        await server.stop()
        raise
    return server, pg, envoy.url


async def test_scale_from_zero_serves_the_first_request(tmp_path):
    server, pg, url = await zero_stack(tmp_path, "zero")
    try:
        conn = connector(server)
        assert conn.replicas()[AGG].active == 0 and len(server.datastore) == 0
        body = {"model": "tiny", "prompt": "wake up", "max_tokens": 5}
        async with aiohttp.ClientSession() as session:
            started = time.monotonic()
            replies = await asyncio.gather(
                *(session.post(url + "/v1/completions", json=body) for _ in range(3))
            )
            cold_start_s = time.monotonic() - started
            statuses = [r.status for r in replies]
            texts = [await r.text() for r in replies]
        assert statuses == [200, 200, 200], texts
        # three waiting requests started exactly one replica
        assert conn.replicas()[AGG].ready == 1 and len(conn.workers()) == 1
        print(f"cold start from zero with epp sim: {cold_start_s:.2f} s")
    finally:
        await pg.aclose()
        await server.stop()


async def test_scale_from_zero_times_out_with_a_clear_503(tmp_path):
    # a replica that never answers its health check: `sleep` binds no port
    server, pg, url = await zero_stack(
        tmp_path, "never", **{"worker-command": "sleep 600 {port}", "cold-start-timeout": 1}
    )
    try:
        async with aiohttp.ClientSession() as session:
            body = {"model": "tiny", "prompt": "anyone?", "max_tokens": 5}
            async with session.post(url + "/v1/completions", json=body) as r:
                status, text = r.status, await r.text()
        assert status == 503
        assert "scaling from zero and no replica was ready within 1 s" in text
    finally:
        await pg.aclose()
        await server.stop()
