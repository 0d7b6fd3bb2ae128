"""The planner in a P/D pool, end to end with real processes: a real Envoy, `epp serve`
(in-process `EppServer` with `config/pd-disagg.yaml` and `--planner`), prefill and
decode `epp sim` replicas the local connector starts from a command template per role,
and an `epp sidecar` beside every decode replica. Ticks are given by hand
(`ManualTicks`): the test decides when an interval closes, nothing depends on speed.

Mode `load` (seed 002), pool disaggregated, one replica per role to start:

- prefill rule: mean prefill queue per prefill replica > 0.5 (and its trend
  `last + (last − first) × 3` > 0.5) adds a prefill replica. Long unique prompts
  (~3,000 tokens, never cached, so the decider sends each to a prefill server) at
  0.5 ms per prompt token take ~1.5 s each on a prefill server that runs one at a time
  (`--max-num-seqs 1`): 6 clients keep ~5 waiting there, 5 / 1 > 0.5. They ask for 2
  tokens, so decode stays light: a decode server holds 2 of them at most, ~2 × 4,000 /
  262,144 KV tokens ≈ 0.03 < the 0.3 decode threshold, even if a few wait.
- decode rule: `kv_mean + 0.02 × waiting per decode replica` > 0.3 adds a decode
  replica. 24 clients with short prompts (decode-only) and 80 output tokens on a decode
  server that runs 2 at a time keep ~22 waiting: 0.02 × 22 = 0.44 > 0.3. Their
  prompts never reach a prefill server: its queue is 0, so prefill does not grow.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from epp.composition import install_plugins
from epp.config.loader import load_config_file
from epp.harness.envoy import EnvoyOptions, astart_envoy
from epp.harness.localstack import PD_CONFIG
from epp.harness.procs import ProcessGroup, pid_runs
from epp.planner.core.config import load_planner_file
from epp.planner.core.types import Role
from epp.planner.live.connectors.local import LocalConnector
from epp.planner.live.loop import ManualTicks
from epp.scheduling.registry import Handle
from epp.serve import EppServer, ServeOptions
from tests.eventually import eventually

# Replicas start, get scraped and take load: the deadline only bounds a broken run.
WAIT_S = 300.0

pytestmark = pytest.mark.e2e

P, D = Role.PREFILL, Role.DECODE
PREFILL_SIM = (
    "epp sim --port {port} --name-prefix {name} --kv-role prefill --max-num-seqs 1 "
    "--prefill-ms-per-token 0.5 --decode-ms-per-token 2"
)
DECODE_SIM = (
    "epp sim --port {port} --name-prefix {name} --kv-role decode --max-num-seqs 2 "
    "--prefill-ms-per-token 0.01 --decode-ms-per-token 4 --kv-capacity-tokens 262144"
)


def planner_file(tmp: Path) -> str:
    keys = {
        "mode": "load",
        "pool": "disaggregated",
        "adjustment-interval": 2,
        "metric-pulling-interval": 1,
        "min-endpoint": 1,
        "max-gpu-budget": 4,
        "decode-kv-scale-up-threshold": 0.3,
        "decode-kv-scale-down-threshold": 0.01,
        "prefill-worker-command": PREFILL_SIM,
        "decode-worker-command": DECODE_SIM,
        "worker-ready-timeout": 60,
        "drain-timeout": 60,
        "statefile": str(tmp / "state" / "{pool}.json"),
        "log-dir": str(tmp / "log"),
    }
    return "\n".join(f"{k}: {json.dumps(v)}" for k, v in keys.items())


def long_prompt() -> str:
    """~3,000 tokens nobody sent before (nothing cached: the decider disaggregates it)."""
    return f"{uuid.uuid4()} " + " ".join(f"fact{i} about scaling." for i in range(1000))


class Load:
    """`concurrency` clients sending `body()` back to back until stopped; every status
    is kept."""

    def __init__(self, url: str, concurrency: int, body: Callable[[], dict]) -> None:
        self.url, self.concurrency, self.body = url, concurrency, body
        self.statuses: list[int] = []
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task] = []

    async def _client(self) -> None:
        while not self._stop.is_set():
            async with self._session.post(self.url + "/v1/completions", json=self.body()) as r:
                await r.read()
                self.statuses.append(r.status)

    async def __aenter__(self) -> Load:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120))
        self._tasks = [asyncio.create_task(self._client()) for _ in range(self.concurrency)]
        return self

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)
        await self._session.close()

    async def __aexit__(self, *exc: object) -> None:
        if not self._stop.is_set():
            await self.stop()


def prefill_body() -> dict:
    return {"model": "tiny", "prompt": long_prompt(), "max_tokens": 2, "stream": True}


_n = itertools.count()


def decode_body() -> dict:
    return {"model": "tiny", "prompt": f"short {next(_n)}", "max_tokens": 80,
            "ignore_eos": True, "stream": True}  # fmt: skip


def waiting(server: EppServer, role: Role) -> int:
    return sum(
        s.metrics.waiting_queue_size
        for s in server.datastore.snapshot()
        if s.endpoint.role == role.value and s.healthy
    )


def healthy(server: EppServer, role: Role) -> int:
    return sum(
        s.healthy and not s.draining
        for s in server.datastore.snapshot()
        if s.endpoint.role == role.value
    )


def received(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/admin", timeout=5) as r:
        return int(json.loads(r.read())["stats"]["requests_received"])


@pytest.fixture
async def pd(tmp_path):
    cfg = load_planner_file(planner_file(tmp_path), "planner.yaml")
    opts = ServeOptions(host="127.0.0.1", grpc_port=0, health_port=0, metrics_port=0,
                        planner=cfg, pool_name="pd")  # fmt: skip
    config = load_config_file(PD_CONFIG, Handle(rng=random.Random(0)), install_plugins())
    ticks = ManualTicks()
    server = EppServer(opts, config, planner_ticks=ticks)
    await server.start()
    pg = ProcessGroup()
    try:
        envoy = await astart_envoy(
            pg, EnvoyOptions.loopback(server.grpc_port, server.health_port), timeout=60
        )
        yield server, ticks, envoy.url
    finally:
        await pg.aclose()
        await server.stop()


async def interval(
    server: EppServer, ticks: ManualTicks, t: list[float], load: Callable[[], bool], what: str
) -> None:
    """Two ticks (sample, then sample + decide: interval 2, pulling 1), each taken only
    once `load()` holds, so every sample of the interval shows the load (a queue read
    at a lucky instant cannot flip the decision); then wait for the connector to carry
    the decision out."""
    for _ in range(2):
        await eventually(load, what, timeout=WAIT_S)
        t[0] += 1.0
        await asyncio.to_thread(ticks.advance, t[0])
    planner = server.planner
    assert planner is not None
    if planner.last_apply is not None:
        await asyncio.wrap_future(planner.last_apply)
    conn = planner.connector
    assert isinstance(conn, LocalConnector)
    await conn.settle()


async def test_prefill_and_decode_scale_independently_and_no_request_fails(pd, tmp_path):
    server, ticks, url = pd
    assert server.planner is not None
    conn = server.planner.connector
    assert isinstance(conn, LocalConnector)
    await conn.settle()
    assert conn.replicas()[P].ready == 1 and conn.replicas()[D].ready == 1
    await eventually(
        lambda: healthy(server, P) == 1 and healthy(server, D) == 1, "scrapes", timeout=WAIT_S
    )
    # every decode replica is its server plus its sidecar, in one process group; the
    # pool lists the sidecar
    (dec,) = [w for w in conn.workers() if w.role == D]
    assert dec.sidecar_pid and pid_runs(dec.sidecar_pid) and dec.server_port != dec.port
    assert os.getpgid(dec.sidecar_pid) == dec.pid
    assert server.datastore.get(dec.name).port == dec.port
    t = [0.0]

    # ---- prefill-heavy load: prefill scales up, decode does not ---------------
    # The window opens before the load (first queue sample 0); the next two samples are
    # taken with ≥ 3 waiting: mean ≥ (0 + 3 + 3) / 3 = 2 > 0.5 per replica, and LOAD-v0's
    # trend last + (last − first) × 3 ≥ 3 + 3 × 3 = 12 > 0.5.
    await asyncio.to_thread(ticks.advance, t[0])
    async with Load(url, 6, prefill_body) as load:
        await interval(server, ticks, t, lambda: waiting(server, P) >= 3, "a prefill queue")
        decision = server.planner.decisions[-1]
        assert decision.target(P) == 2 and decision.target(D) == 1, decision.reason
        assert conn.replicas()[P].ready == 2 and conn.replicas()[D].ready == 1
        # the new prefill replica gets remote prefills through the decode sidecar (it is
        # in the sidecar's allowlist before the EPP routes to it: no 403)
        new = next(w for w in conn.workers() if w.role == P and w.name != "prefill-0")
        await eventually(
            lambda: received(new.port) >= 1, "a remote prefill on the new replica", timeout=WAIT_S
        )
    assert load.statuses and set(load.statuses) == {200}, sorted(set(load.statuses))
    listed = json.loads(conn.prefill_file.read_text())
    assert sorted(e["port"] for e in listed) == sorted(w.port for w in conn.workers()
                                                      if w.role == P)  # fmt: skip

    # ---- decode-heavy load: decode scales up, prefill does not ----------------
    async with Load(url, 24, decode_body) as load:
        # each sample with ≥ 16 waiting on the one decode replica: 0.02 × 16 = 0.32 > 0.3.
        # An interval whose ready counts changed (prefill 1 → 2 above) is skipped, so
        # allow a few; prefill may shrink meanwhile (its queue is 0) but never grows
        for _ in range(4):
            await interval(server, ticks, t, lambda: waiting(server, D) >= 16, "a decode queue")
            d = server.planner.decisions[-1]
            assert d.target(P) <= 2, d.reason
            if d.target(D) == 2:
                break
        assert server.planner.decisions[-1].target(D) == 2, [
            x.reason for x in server.planner.decisions
        ]
        assert conn.replicas()[D].ready == 2
        decoders = [w for w in conn.workers() if w.role == D]
        assert all(w.sidecar_pid and pid_runs(w.sidecar_pid) for w in decoders)
        await eventually(
            lambda: healthy(server, D) == 2, "the new decode replica to be scraped", timeout=WAIT_S
        )
        before = len(load.statuses)
        await eventually(
            lambda: len(load.statuses) >= before + 24, "traffic on two decoders", timeout=WAIT_S
        )
    assert load.statuses and set(load.statuses) == {200}, sorted(set(load.statuses))
    prefill_targets = [x.target(P) for x in server.planner.decisions]
    assert max(prefill_targets) == 2 and prefill_targets[0] == 2

    # ---- a clean exit leaves no server and no sidecar behind -------------------
    pids = [p for w in conn.workers() for p in (w.pid, w.sidecar_pid) if p]
    assert len(pids) == conn.replicas()[P].active + 2 * conn.replicas()[D].active
    await server.stop()
    for pid in pids:
        assert not pid_runs(pid), pid
    state = json.loads((tmp_path / "state" / "pd.json").read_text())
    assert state["workers"] == []
