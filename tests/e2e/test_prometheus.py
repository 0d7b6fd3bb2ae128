"""deploy/prometheus/ and deploy/grafana/ against a real Prometheus (Debian's package).

- The alert rules pass `promtool check rules` and their unit tests (`promtool test rules`:
  each alert fires on a series made to trigger it and stays silent on a healthy one).
- The shipped scrape config passes `promtool check config` (Debian builds Prometheus
  without Kubernetes service discovery, so its `kubernetes_sd_configs` are swapped for
  empty static lists first; the relabelling and the rest are checked as shipped).
- A real Prometheus scrapes a P/D stack (`epp serve` behind Envoy, an `epp sim` prefill
  server, an `epp sim` decode server behind `epp sidecar`) and a second `epp serve` that
  runs the planner, with the shipped jobs and rules at a 1 s interval; after traffic,
  every query of the dashboard returns data. Flow-control queries are required only
  when the EPP exposes flow-control metrics (see FLOW_CONTROL below).

`make test` installs Debian's prometheus when missing (scripts/system-packages.sh).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import aiohttp
import pytest
import yaml

from epp.harness.localstack import LocalStack, PDLayout
from epp.harness.procs import HttpReady, LogReady, ProcessGroup, free_port, wait_ready

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
PROM_DIR = ROOT / "deploy" / "prometheus"
RULES = PROM_DIR / "rules" / "epp.rules.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "epp-dashboard.json"
# Queries over GIE's flow-control metrics: they have data only in an EPP with flow
# control on. Required when the EPP under test runs it (its pool-saturation gauge has a
# sample); this stack's P/D config does not, so tests/integration/test_flow_control.py
# checks those metrics' labels and values instead.
FLOW_CONTROL = "inference_extension_flow_control_"
SIM_ARGS = ["--max-num-seqs", "4", "--decode-ms-per-token", "2", "--prefill-ms-per-token", "0.01"]


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} not found: `make test` installs Debian's prometheus package "
            "(scripts/system-packages.sh), or run `apt-get install prometheus`"
        )
    return path


def run(argv: list[str], cwd: Path | None = None) -> str:
    out = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=120)
    assert out.returncode == 0, f"{' '.join(argv)} failed:\n{out.stdout}\n{out.stderr}"
    return out.stdout


def test_alert_rules_check_and_unit_tests():
    promtool = tool("promtool")
    assert "SUCCESS: 5 rules found" in run([promtool, "check", "rules", str(RULES)])
    out = run([promtool, "test", "rules", "epp.rules.test.yaml"], cwd=RULES.parent)
    assert "SUCCESS" in out


def test_shipped_scrape_config_checks(tmp_path):
    cfg = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
    assert [j["job_name"] for j in cfg["scrape_configs"]] == ["epp", "model-servers"]
    for job in cfg["scrape_configs"]:
        assert job.pop("kubernetes_sd_configs") == [{"role": "pod"}]
        job["static_configs"] = []
    cfg["rule_files"] = [str(RULES)]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(cfg))
    run([tool("promtool"), "check", "config", str(path)])


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, expr) for every target of every panel, Grafana variables filled:
    every pool, and a 30 s rate window (30 scrapes at the test's 1 s interval)."""
    dash = json.loads(DASHBOARD.read_text())
    out = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", "30s").replace("$pool", ".+")
            assert "$" not in expr, f"unfilled variable in {panel['title']}: {expr}"
            out.append((panel["title"], expr))
    return out


def test_dashboard_is_grafana_json_with_unique_ids():
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    rows = [p["title"] for p in dash["panels"] if p["type"] == "row"]
    assert rows == ["Pool health", "Scheduling", "Prefix index", "Flow control", "Planner"]
    assert len(dashboard_queries()) >= 40


def scrape_config(epps: list[int], servers: list[tuple[str, int, str]]) -> dict:
    """The shipped jobs with static targets: the EPPs' metrics ports, and the pool's
    model-server ports (a decode server's is its sidecar's, as in deploy/kubernetes/)."""
    shipped = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
    assert [j["job_name"] for j in shipped["scrape_configs"]] == ["epp", "model-servers"]
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {
                "job_name": "epp",
                "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in epps]}],
            },
            {
                "job_name": "model-servers",
                "static_configs": [
                    {"targets": [f"127.0.0.1:{port}"], "labels": {"role": role, "pod": name}}
                    for name, port, role in servers
                ],
            },
        ],
    }


def query(base: str, expr: str) -> list[dict]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["result"]


async def traffic(url: str, n: int) -> list[int]:
    """Shared-prefix chat turns, streamed (TTFT, TPOT), long enough that some go to
    remote prefill (the P/D decider's 256 uncached tokens), and one request for a model the
    pool does not serve (404, counted in inference_objective_request_error_total)."""
    system = "You are a careful assistant. " * 60  # ~300 tokens shared by every request
    sem = asyncio.Semaphore(4)

    async def one(s: aiohttp.ClientSession, i: int) -> int:
        body = {
            "model": "tiny",
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": f"question {i} " + "detail " * (i * 40 % 400)},
            ],
            "max_tokens": 8,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        async with sem, s.post(url + "/v1/chat/completions", json=body) as r:
            await r.read()
            return r.status

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        statuses = list(await asyncio.gather(*(one(s, i) for i in range(n))))
        unknown = {"model": "no-such-model", "prompt": "hi", "max_tokens": 1}
        async with s.post(url + "/v1/completions", json=unknown) as r:
            await r.read()
            statuses.append(r.status)
    return statuses


def planner_file(tmp_path: Path) -> Path:
    """The planner in a second EPP: load mode, one replica it starts itself, a decision
    every second (every epp_planner_* series then exists within seconds)."""
    cfg = tmp_path / "planner.yaml"
    cfg.write_text(
        "mode: load\nmin-endpoint: 1\nmax-gpu-budget: 2\nadjustment-interval: 1\n"
        "metric-pulling-interval: 0.5\n"
        f"worker-command: {sys.executable} -m epp.cli sim --port {{port}}\n"
        f"statefile: {json.dumps(str(tmp_path / 'state.json'))}\n"
    )
    return cfg


def test_every_dashboard_query_has_data_on_a_real_prometheus(tmp_path):
    prometheus = tool("prometheus")
    planner_metrics = free_port()
    argv = [sys.executable, "-m", "epp.cli", "serve", "--host", "127.0.0.1"]
    argv += ["--grpc-port", str(free_port()), "--health-port", str(free_port())]
    argv += ["--metrics-port", str(planner_metrics), "--planner", str(planner_file(tmp_path))]
    pd = PDLayout(n_prefill=1, n_decode=1)
    with ProcessGroup(tmp_path / "planner") as planner_pg:
        # The planner's EPP starts beside the stack (spawned first, waited for after).
        planner_epp = planner_pg.spawn("epp-planner", argv)
        with LocalStack(sim_args=SIM_ARGS, pd=pd, run_dir=tmp_path / "stack") as st:
            wait_ready(planner_epp, LogReady(r"epp serving"), 120)
            check_stack(st, planner_metrics, prometheus, tmp_path)


def check_stack(st: LocalStack, planner_metrics: int, prometheus: str, tmp_path: Path) -> None:
    assert st.pg is not None
    servers = [(s.name, s.port, "prefill") for s in st.sims if s.name.startswith("prefill")]
    servers += [(c.name, c.port, "decode") for c in st.sidecars]
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(yaml.safe_dump(scrape_config([st.epp_metrics_port, planner_metrics], servers)))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    st.pg.start(
        "prometheus",
        [prometheus, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        ready=HttpReady(f"{base}/-/ready"),
        timeout=60,
    )  # fmt: skip

    statuses = asyncio.run(traffic(st.url, 30))
    assert statuses.count(200) == 30 and statuses[-1] == 404, statuses

    epp_text = urllib.request.urlopen(f"{st.epp_metrics_url}/metrics", timeout=5).read()
    # The flow-control histograms are registered in every EPP (HELP/TYPE lines, no
    # samples); the pool-saturation gauge has a sample only where flow control runs.
    flow_on = f"{FLOW_CONTROL}pool_saturation{{".encode() in epp_text
    pending = {
        (title, expr) for title, expr in dashboard_queries() if flow_on or FLOW_CONTROL not in expr
    }
    deadline = time.monotonic() + 90
    while pending and time.monotonic() < deadline:
        pending = {(t, e) for t, e in pending if not query(base, e)}
        if pending:
            asyncio.run(traffic(st.url, 3))  # keep rates above zero while waiting
    assert not pending, "dashboard queries without data:\n" + "\n".join(
        f"  {t}: {e}" for t, e in sorted(pending)
    )

    # The planner EPP's status page data: its replicas and last decisions.
    with urllib.request.urlopen(f"http://127.0.0.1:{planner_metrics}/status.json") as r:
        planner = json.load(r)["planner"]
    assert planner["decisions"] and planner["replicas"]["aggregated"]["ready"] >= 1, planner

    # The seed's labels, as Prometheus stored them.
    picks = query(base, 'inference_extension_scheduler_attempts_total{status="success"}')
    namespace = os.environ.get("NAMESPACE") or "default"  # static endpoints: $NAMESPACE
    assert picks and {r["metric"]["namespace"] for r in picks} == {namespace}
    [info] = query(
        base, f'inference_extension_info{{job="epp",instance="127.0.0.1:{st.epp_metrics_port}"}}'
    )
    assert re.fullmatch(r"[0-9a-f]{7,40}", info["metric"]["commit"]), info
    points = {r["metric"]["extension_point"] for r in query(
        base, "inference_extension_plugin_duration_seconds_count")}  # fmt: skip
    assert {"PrepareData", "ProfilePicker", "Filter", "Scorer", "Picker"} <= points
    assert {"ProcessProfilesResults", "PreRequest"} <= points  # PostResponse: no such
    # plugin in the P/D config; tests/integration/test_status_page_data.py times one.
