"""The planner reading a real Prometheus server: `epp serve` behind a real Envoy in front
of an `epp sim`, Prometheus (Debian's /usr/bin/prometheus; skipped without it, the
loopback stand-in of tests/integration/test_planner_prometheus.py runs everywhere)
scraping the EPP every second, and the planner of `epp planner --prometheus URL`
(`PrometheusSource` + `PlannerThread`) deciding on what Prometheus answers and
publishing over real gRPC (virtual connector). Ticks are given by hand.

Mode `load`, aggregated: 16 clients on one replica that runs 2 at a time keep ~14
waiting: KV use + 0.02 × 14 = 0.28 + KV > 0.15, so the decision is +1 replica.
"""

from __future__ import annotations

import asyncio
import json
import os

import aiohttp
import pytest

from epp.datastore import Datastore
from epp.harness.localstack import LocalStack
from epp.harness.procs import HttpReady, free_port
from epp.planner.core.config import load_planner_file
from epp.planner.core.types import Role
from epp.planner.live.connectors.client import VirtualClient
from epp.planner.live.loop import (
    ManualTicks,
    build_live_planner,
    start_live_planner,
    stop_live_planner,
)
from epp.planner.live.source import PrometheusSource
from tests.eventually import eventually

PROMETHEUS = "/usr/bin/prometheus"
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not os.path.exists(PROMETHEUS), reason=f"no {PROMETHEUS}"),
]
SIM_ARGS = ["--max-num-seqs", "2", "--decode-ms-per-token", "4", "--prefill-ms-per-token", "0.01"]


class Load:
    """`n` clients streaming completions back to back until stopped."""

    def __init__(self, url: str, n: int) -> None:
        self.url, self.n = url, n
        self.statuses: list[int] = []
        self._stop = asyncio.Event()

    async def _client(self, session: aiohttp.ClientSession, i: int) -> None:
        body = {"model": "tiny", "prompt": f"client {i}", "max_tokens": 60,
                "ignore_eos": True, "stream": True}  # fmt: skip
        while not self._stop.is_set():
            async with session.post(self.url + "/v1/completions", json=body) as r:
                await r.read()
                self.statuses.append(r.status)

    async def __aenter__(self) -> Load:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120))
        self._tasks = [asyncio.create_task(self._client(self._session, i)) for i in range(self.n)]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)
        await self._session.close()


async def test_a_real_prometheus_feeds_the_standalone_planner(tmp_path):
    with LocalStack(n_sims=1, sim_args=SIM_ARGS, run_dir=tmp_path / "run") as stack:
        assert stack.pg is not None
        port = free_port()
        (tmp_path / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n- job_name: epp\n  static_configs:\n"
            f"  - targets: ['127.0.0.1:{stack.epp_metrics_port}']\n"
        )
        url = f"http://127.0.0.1:{port}"
        stack.pg.start(
            "prometheus",
            [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
            ready=HttpReady(url + "/-/ready"), timeout=60,
        )  # fmt: skip
        src = PrometheusSource(url, pool="default", match='job="epp"')

        def waiting() -> int:
            return sum(s.waiting for s in src.pool_samples() if s.role == Role.AGGREGATED)

        grpc_port = free_port()
        text = {
            "mode": "load", "adjustment-interval": 10, "metric-pulling-interval": 1,
            "min-endpoint": 1, "max-gpu-budget": 3, "decode-kv-scale-up-threshold": 0.15,
            "decode-kv-scale-down-threshold": 0.05, "environment": "virtual",
            "virtual-address": f"127.0.0.1:{grpc_port}", "log-dir": str(tmp_path / "log"),
        }  # fmt: skip
        cfg = load_planner_file("\n".join(f"{k}: {json.dumps(v)}" for k, v in text.items()), "p")
        ticks = ManualTicks()
        loop = asyncio.get_running_loop()
        planner = build_live_planner(cfg, None, Datastore(), loop, ticks=ticks, source=src)
        await start_live_planner(planner, 1)
        client = VirtualClient(f"127.0.0.1:{grpc_port}")
        try:
            await client.complete(await client.get())  # the floor: 1 replica
            async with Load(stack.url, 16) as load:
                await eventually(
                    lambda: waiting() >= 8,
                    "Prometheus to see a queue",
                    90,
                    blocking=True,
                    interval=0.2,
                )
                await eventually(
                    lambda: src.requests(10)["completions"] > 0,
                    "completions",
                    90,
                    blocking=True,
                    interval=0.2,
                )
                for t in (0.0, 10.0):  # open the window (and sample), then sample + decide
                    await asyncio.to_thread(ticks.advance, t)
                assert planner.last_apply is not None
                await asyncio.wrap_future(planner.last_apply)
            decision = await client.get()
            assert decision.num_decode_workers == 2, planner.decisions[-1].reason
            assert set(load.statuses) == {200}
            line = json.loads((tmp_path / "log" / "decisions.jsonl").read_text().splitlines()[-1])
            observed = line["observed"]
            # what Prometheus said about the last 10 s of traffic reached the decision
            assert observed["arrivals"] > 0 and observed["completions"] > 0, observed
        finally:
            await client.close()
            await stop_live_planner(planner)
