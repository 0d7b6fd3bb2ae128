"""bench/routing_vr.py reads vllm-router's own counters after a run: its prefix-routing
decisions by outcome and kv_aware's index lookups, from a real loopback /metrics; builds
its command line; relays KV events under the empty topic it reads."""

from __future__ import annotations

import importlib.util
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
import zmq

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


def test_router_argv_gives_each_worker_its_kv_event_source() -> None:
    vr = load()
    urls = ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
    sources = ["tcp://127.0.0.1:6001", "tcp://127.0.0.1:6002"]
    argv = vr.router_argv("vr", "kv_aware", 9000, 9001, urls, 120.0, sources, 32, "tiny")
    assert argv[:7] == ["vr", "--host", "127.0.0.1", "--port", "9000", "--policy", "kv_aware"]
    pairs = [argv[i + 1] for i, a in enumerate(argv) if a == "--kv-event-source"]
    assert pairs == [f"{u}={s}" for u, s in zip(urls, sources, strict=True)]
    assert argv[argv.index("--kv-event-block-size") + 1] == "32"
    assert argv[argv.index("--kv-event-model") + 1] == "tiny"
    assert argv[argv.index("--request-timeout-secs") + 1] == "130"  # 120 s + 10
    # cache_aware: no KV-event flags at all
    plain = vr.router_argv("vr", "cache_aware", 9000, 9001, urls, 120.0)
    assert not [a for a in plain if a.startswith("--kv-event")]
    assert plain[plain.index("--worker-urls") + 1 :][:2] == urls


def test_router_argv_refuses_sources_that_do_not_match_the_workers() -> None:
    vr = load()
    urls = ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
    with pytest.raises(ValueError, match="1 KV-event sources for 2 workers"):
        vr.router_argv("vr", "kv_aware", 1, 2, urls, 1.0, ["tcp://x:1"], 32, "tiny")
    with pytest.raises(ValueError, match="block_size and model"):
        vr.router_argv("vr", "kv_aware", 1, 2, urls, 1.0, ["tcp://x:1", "tcp://x:2"], 32, None)


def test_relay_republishes_each_sources_events_under_the_empty_topic() -> None:
    """Two real PUB sockets (as two vLLM servers binding `tcp://*:PORT`) → the relay →
    one SUB per relayed address, subscribed to the empty topic only, as vllm-router is."""
    vr = load()
    ctx = zmq.Context()
    pubs = [ctx.socket(zmq.PUB) for _ in range(2)]
    ports = [p.bind_to_random_port("tcp://127.0.0.1") for p in pubs]
    try:
        with vr.EmptyTopicRelay([f"tcp://127.0.0.1:{p}" for p in ports]) as relay:
            subs = []
            for address in relay.addresses:
                sub = ctx.socket(zmq.SUB)
                sub.setsockopt(zmq.SUBSCRIBE, b"")
                sub.connect(address)
                subs.append(sub)
            got: list[list[bytes] | None] = [None, None]
            deadline = time.monotonic() + 30  # ZMQ drops what is sent before a SUB joins
            while None in got and time.monotonic() < deadline:
                for i, pub in enumerate(pubs):
                    seq = (7 + i).to_bytes(8, "big")
                    pub.send_multipart([f"kv@127.0.0.1:{ports[i]}@tiny".encode(), seq, b"p%d" % i])
                for i, sub in enumerate(subs):
                    if got[i] is None and sub.poll(100):
                        got[i] = sub.recv_multipart()
            for sub in subs:
                sub.close(linger=0)
        # server i's message arrives on relayed address i only, topic emptied, rest intact
        assert got == [
            [b"", (7).to_bytes(8, "big"), b"p0"],
            [b"", (8).to_bytes(8, "big"), b"p1"],
        ]
        assert relay.forwarded >= 2
    finally:
        for p in pubs:
            p.close(linger=0)
        ctx.term()
