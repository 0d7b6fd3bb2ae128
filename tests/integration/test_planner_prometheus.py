"""The planner reading Prometheus (`epp planner --prometheus URL`), against a loopback
HTTP server that answers `GET /api/v1/query` exactly as Prometheus does (its JSON
envelope, values as strings, "NaN" for 0/0, an empty vector for no series, 400 with
`errorType`/`error` for a bad query). This runs on every machine; the same path against
a real Prometheus server is tests/e2e/test_planner_prometheus.py (skipped without
/usr/bin/prometheus). Decisions reach a real VirtualConnector over real gRPC.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from epp.datastore import Datastore
from epp.harness.procs import free_port
from epp.planner.core.config import load_planner_file
from epp.planner.core.types import Role
from epp.planner.live.connectors.client import VirtualClient
from epp.planner.live.loop import (
    ManualTicks,
    build_live_planner,
    start_live_planner,
    stop_live_planner,
)
from epp.planner.live.source import PrometheusSource, SourceError


class FakePrometheus:
    """`answers[promql]` → list of (labels, value); every query received is kept."""

    def __init__(self) -> None:
        self.answers: dict[str, list[tuple[dict[str, str], float]]] = {}
        self.received: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                if url.path != "/api/v1/query":
                    self._send(404, {"status": "error", "error": "not found"})
                    return
                promql = urllib.parse.parse_qs(url.query)["query"][0]
                fake.received.append(promql)
                if promql.startswith("bad("):
                    self._send(400, {"status": "error", "errorType": "bad_data",
                                     "error": 'parse error: unknown function "bad"'})  # fmt: skip
                    return
                result = [
                    {"metric": labels, "value": [time.time(), _text(v)]}
                    for labels, v in fake.answers.get(promql, [])
                ]
                self._send(200, {"status": "success",
                                 "data": {"resultType": "vector", "result": result}})  # fmt: skip

            def _send(self, status: int, body: dict) -> None:
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _text(v: float) -> str:
    """Prometheus writes sample values as strings, NaN as "NaN"."""
    return "NaN" if math.isnan(v) else repr(v)


@pytest.fixture
def prom():
    p = FakePrometheus()
    yield p
    p.close()


def test_request_statistics_are_the_interval_queries_of_the_epps_histograms(prom):
    src = PrometheusSource(prom.url, pool="p", match='job="epp"')
    q = src.queries(30)
    # the PromQL of reference §1.3 on this EPP's names, summed over series (#6500)
    assert q["ttft_ms.mean"] == (
        'sum(increase(inference_objective_request_ttft_seconds_sum{job="epp"}[30s])) / '
        'sum(increase(inference_objective_request_ttft_seconds_count{job="epp"}[30s]))'
    )
    assert q["arrivals"] == 'sum(increase(inference_objective_request_total{job="epp"}[30s]))'
    assert q["itl_ms.p90"] == (
        "histogram_quantile(0.9, sum by (le) "
        '(increase(inference_objective_request_tpot_seconds_bucket{job="epp"}[30s])))'
    )
    prom.answers = {
        q["arrivals"]: [({}, 15.4)],  # increase() extrapolates: 15.4 admitted → 15
        q["duration_s.count"]: [({}, 12.0)],
        q["ttft_ms.count"]: [({}, 12.0)],
        q["ttft_ms.mean"]: [({}, 0.25)],  # 0.25 s → 250 ms
        q["ttft_ms.p50"]: [({}, 0.2)],
        q["ttft_ms.p90"]: [({}, 0.4)],
        q["ttft_ms.p99"]: [({}, 0.6)],
        q["isl.count"]: [({}, 12.0)],
        q["isl.mean"]: [({}, 700.0)],
        q["isl.p90"]: [({}, 1024.0)],
        q["itl_ms.count"]: [({}, 0.0)],  # no streamed request: ITL unknown
        q["itl_ms.mean"]: [({}, math.nan)],  # 0/0
    }
    got = src.requests(30)
    assert got["arrivals"] == 15 and got["completions"] == 12
    t = got["ttft_ms"]
    assert (t.count, t.mean, t.p50, t.p90, t.p99) == (12, 250.0, 200.0, 400.0, 600.0)
    assert got["isl"].mean == 700.0 and got["isl"].p90 == 1024.0
    assert math.isnan(got["isl"].p50)  # no answer for that query: unknown, not 0
    assert got["itl_ms"].empty and math.isnan(got["itl_ms"].mean)
    assert got["osl"].empty  # no series at all
    assert set(prom.received) == set(q.values())


def test_pool_samples_are_the_per_role_gauges_of_one_pool(prom):
    src = PrometheusSource(prom.url, pool="pd")
    q = src.pool_queries()
    assert q["waiting"] == 'max by (role) (inference_pool_role_queue_size{name="pd"})'
    prom.answers = {
        q["waiting"]: [({"role": "prefill"}, 6.0), ({"role": "decode"}, 0.0)],
        q["running"]: [({"role": "prefill"}, 2.0), ({"role": "decode"}, 3.0)],
        q["kv_mean"]: [({"role": "prefill"}, 0.1), ({"role": "decode"}, 0.42)],
        q["ready"]: [({"role": "prefill"}, 2.0), ({"role": "decode"}, 1.0)],
    }
    samples = {s.role: s for s in src.pool_samples()}
    assert set(samples) == {Role.PREFILL, Role.DECODE}
    p, d = samples[Role.PREFILL], samples[Role.DECODE]
    assert (p.waiting, p.running, p.kv_mean, p.ready) == (6, 2, 0.1, 2)
    assert (d.waiting, d.running, d.kv_mean, d.ready) == (0, 3, 0.42, 1)


def test_a_bad_query_or_a_dead_server_is_a_source_error_naming_it(prom):
    src = PrometheusSource(prom.url)
    with pytest.raises(SourceError, match='unknown function "bad"'):
        src.query("bad(x)")
    dead = PrometheusSource(f"http://127.0.0.1:{free_port()}", timeout_s=2)
    with pytest.raises(SourceError, match=r"127\.0\.0\.1"):
        dead.pool_samples()


def planner_text(tmp: Path, port: int, **extra: object) -> str:
    keys = {
        "mode": "load",
        "adjustment-interval": 2,
        "metric-pulling-interval": 1,
        "min-endpoint": 1,
        "max-gpu-budget": 4,
        "decode-kv-scale-up-threshold": 0.5,
        "decode-kv-scale-down-threshold": 0.1,
        "environment": "virtual",
        "virtual-address": f"127.0.0.1:{port}",
        "log-dir": str(tmp / "log"),
        **extra,
    }
    return "\n".join(f"{k}: {json.dumps(v)}" for k, v in keys.items())


async def test_the_planner_decides_on_prometheus_and_publishes_over_grpc(prom, tmp_path):
    port = free_port()
    cfg = load_planner_file(planner_text(tmp_path, port), "planner.yaml")
    src = PrometheusSource(prom.url, pool="agg")
    q = src.pool_queries()
    # one aggregated replica, KV 0.4 and 10 waiting: 0.4 + 0.02 × 10 = 0.6 > 0.5 → +1
    prom.answers = {
        q["waiting"]: [({"role": "aggregated"}, 10.0)],
        q["kv_mean"]: [({"role": "aggregated"}, 0.4)],
        q["ready"]: [({"role": "aggregated"}, 1.0)],
        src.queries(2)["arrivals"]: [({}, 30.0)],
    }
    ticks = ManualTicks()
    loop = asyncio.get_running_loop()
    planner = build_live_planner(cfg, None, Datastore(), loop, ticks=ticks, source=src)
    await start_live_planner(planner, cfg.budget.min_endpoint)
    client = VirtualClient(f"127.0.0.1:{port}")
    try:
        first = await client.get()  # the min-endpoint floor, published at start
        assert (first.num_decode_workers, first.decision_id) == (1, 0)
        await client.complete(first)
        for t in (0.0, 1.0, 2.0):  # open the window, sample, sample + decide
            await asyncio.to_thread(ticks.advance, t)
        await asyncio.wrap_future(planner.last_apply)
        decision = await client.get()
        assert (decision.num_decode_workers, decision.decision_id) == (2, 1)
        line = json.loads((tmp_path / "log" / "decisions.jsonl").read_text().splitlines()[-1])
        assert line["observed"]["arrivals"] == 30

        # Prometheus gone: the next interval is not decided on (no guess from nothing)
        await client.complete(decision)
        prom.close()
        before = len(planner.decisions)
        for t in (3.0, 4.0):
            await asyncio.to_thread(ticks.advance, t)
        assert len(planner.decisions) == before
    finally:
        await client.close()
        await stop_live_planner(planner)


def test_the_cli_runs_standalone_and_publishes_the_floor(prom, tmp_path):
    port = free_port()
    path = tmp_path / "planner.yaml"
    path.write_text(planner_text(tmp_path, port, **{"min-endpoint": 2}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "epp.cli", "planner", "--prometheus", prom.url,
         "--planner", str(path), "--pool-name", "agg"],
        stdout=subprocess.PIPE, stderr=(tmp_path / "planner.log").open("w"), text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("epp planner: deciding every 2 s from " + prom.url), line
        assert f"environment virtual on port {port}" in line

        async def floor() -> int:
            client = VirtualClient(f"127.0.0.1:{port}")
            try:
                return (await client.get()).num_decode_workers
            finally:
                await client.close()

        assert asyncio.run(floor()) == 2  # min-endpoint 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--prometheus", "prom:9090"], "--prometheus: 'prom:9090' must start with http://"),
        (["--metrics-port", "70000"], "--metrics-port: 70000 is not a port"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(tmp_path, argv, says):
    path = tmp_path / "planner.yaml"
    path.write_text(planner_text(tmp_path, free_port()))
    base = ["--prometheus", "http://127.0.0.1:9", "--planner", str(path)]
    r = subprocess.run([sys.executable, "-m", "epp.cli", "planner", *base, *argv],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert says in r.stderr


def test_environment_local_is_refused_with_the_reason(tmp_path):
    path = tmp_path / "planner.yaml"
    path.write_text("mode: load\nenvironment: local\n")
    r = subprocess.run(
        [sys.executable, "-m", "epp.cli", "planner", "--prometheus", "http://127.0.0.1:9",
         "--planner", str(path)], capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "environment: local needs the EPP's datastore" in r.stderr
    assert os.fspath(path) in r.stderr
