"""bench/routing_vr.py reads vllm-router's own counters after a run: its prefix-routing
decisions by outcome and kv_aware's index lookups, from a real loopback /metrics."""

from __future__ import annotations

import importlib.util
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# As vllm-router 0.1.17 writes them (read from a live router on the simulator pool).
D = "vllm_router_prefix_routing_decisions_total"
METRICS = f"""# TYPE {D} counter
{D}{{policy="cache_aware",stage="regular",outcome="prefix_hit"}} 31
{D}{{policy="cache_aware",stage="regular",outcome="prefix_miss"}} 39
{D}{{policy="cache_aware",stage="prefill",outcome="prefix_hit"}} 2
vllm_router_kv_placement_lookups_total{{result="hit"}} 25
vllm_router_kv_placement_lookups_total{{result="miss"}} 40
vllm_router_processed_requests_total{{worker="http://127.0.0.1:1"}} 70
"""


def load():
    path = ROOT / "bench" / "routing_vr.py"
    spec = importlib.util.spec_from_file_location("epp_bench_routing_vr_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = METRICS.encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_decisions_by_outcome_and_lookups_from_the_routers_metrics() -> None:
    vr = load()
    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        vr._METRICS["http://proxy"] = f"http://127.0.0.1:{server.server_port}/metrics"
        # prefix_hit summed over stages: 31 + 2 = 33; other series are ignored.
        assert vr.decisions("http://proxy") == {
            "prefix_hit": 33.0,
            "prefix_miss": 39.0,
            "kv_lookup_hit": 25.0,
            "kv_lookup_miss": 40.0,
        }
        assert vr.decisions("http://unknown") == {}  # a router this run did not start
    finally:
        server.shutdown()
        server.server_close()


def test_a_router_whose_metrics_do_not_answer_reports_nothing() -> None:
    vr = load()
    server = HTTPServer(("127.0.0.1", 0), Handler)
    port = server.server_port
    server.server_close()  # nothing listens there any more
    vr._METRICS["http://proxy"] = f"http://127.0.0.1:{port}/metrics"
    assert vr.decisions("http://proxy") == {}
