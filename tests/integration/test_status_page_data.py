"""What the status page and the seed's metric labels are built from, in-process.

The page itself runs in headless Chromium in tests/e2e/test_status_page.py; here: the
decision ring stays bounded, /status.json carries each scorer's score and totals that
add up, NaN never reaches the browser, `/` loads nothing from outside the EPP, and the
`namespace`, `commit` and every extension point's timing reach /metrics.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess

import aiohttp
import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from prometheus_client.parser import text_string_to_metric_families

from epp.buildinfo import build_commit
from epp.completion import ResponseObserver
from epp.director import RoutingDecision
from epp.observability import REGISTRY
from epp.planner.core.window import RequestRecord
from epp.scheduling.types import ProfileResult, SchedulingResult
from epp.serve import EppServer, add_arguments, options_from_args
from epp.status.ring import DecisionRing
from epp.status.routes import _finite
from epp.status.snapshot import prefix_index
from tests.helpers import completion, snap
from tests.integration.test_epp_metrics import completion_stream, loopback_options


def test_ring_keeps_the_last_n_newest_first():
    ring = DecisionRing(size=3, clock=iter(range(100)).__next__)
    a = snap("a")
    for i in range(5):
        ring.record(completion(f"p{i}"), SchedulingResult({"d": ProfileResult([a])}, "d"))
    rows = ring.rows()
    assert ring.total == 5
    assert [r["at"] for r in rows] == [4, 3, 2]  # clock ticks 0..4; the last three kept
    assert rows[0]["profiles"]["d"] == {"targets": ["a"]}  # no breakdown: targets only


async def _route(server: EppServer, n: int) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as ch:
        stub = pb_grpc.ExternalProcessorStub(ch)
        for _ in range(n):
            replies = [r async for r in stub.Process(iter(completion_stream("m")))]
            assert replies[0].HasField("request_headers")


async def _get(server: EppServer, path: str) -> tuple[str, str]:
    url = f"http://127.0.0.1:{server.metrics_port}{path}"
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        assert r.status == 200, path
        return r.headers["Content-Type"], await r.text()


async def test_status_json_has_pool_decisions_and_per_scorer_scores():
    async with EppServer(loopback_options(pool_name="pool-s"), seed=0) as server:
        await _route(server, 3)
        ctype, text = await _get(server, "/status.json")
    assert ctype.startswith("application/json")
    s = json.loads(text)
    assert s["pool"] == "pool-s"
    assert [e["name"] for e in s["endpoints"]] == ["e0", "e1"]
    assert all(e["healthy"] and e["last_score"] is not None for e in s["endpoints"])
    assert s["decisions_total"] == 3 and len(s["decisions"]) == 3
    prof = s["decisions"][0]["profiles"]["default"]
    # The default config: SLO ×2 (0.5 everywhere for a request without targets),
    # token-load ×1, prefix ×1e-7 (config/default.yaml).
    assert [(x["name"], x["weight"]) for x in prof["scorers"]] == [
        ("slo-calibrated-scorer", 2.0),
        ("token-load-scorer", 1.0),
        ("prefix-cache-scorer", 1e-7),
    ]
    weights = [x["weight"] for x in prof["scorers"]]
    for e in prof["endpoints"]:
        # total = Σ weight × clamp(score, 0, 1), e.g. 2×0.5 + 1×1 + 1e-7×0 = 2 on an idle pool
        expect = sum(w * min(1.0, max(0.0, x)) for w, x in zip(weights, e["scores"], strict=True))
        assert math.isclose(e["total"], expect, abs_tol=1e-3), e
    assert s["decisions"][0]["target"] in prof["targets"]
    assert s["planner"] is None


async def test_page_is_self_contained_html():
    async with EppServer(loopback_options(), seed=0) as server:
        ctype, page = await _get(server, "/")
    assert ctype.startswith("text/html")
    assert "status.json" in page and "<script>" in page
    # No CDN, no external script, style or font: everything comes from the EPP.
    assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", page)
    assert "innerHTML" not in page  # client text (model names, request ids) as text only


def test_non_finite_numbers_become_null():
    assert _finite({"a": [math.nan, 1.5, math.inf], "b": {"c": -math.inf}}) == {
        "a": [None, 1.5, None],
        "b": {"c": None},
    }


def test_prefix_index_summary_from_the_registry():
    from plugins.prefix.metrics import HIT_RATIO, INDEXER_SIZE

    before = prefix_index(REGISTRY) or {"lookups": 0.0}
    INDEXER_SIZE.set(7)
    for ratio in (0.0, 0.5, 1.0):  # one miss, two hits
        HIT_RATIO.observe(ratio)
    after = prefix_index(REGISTRY)
    assert after is not None and after["size"] == 7
    assert after["lookups"] - before["lookups"] == 3
    assert 0.0 < after["hit_rate"] < 1.0


def _samples(text: str, name: str) -> list:
    return [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


async def test_attempts_carry_the_namespace_and_info_the_commit(monkeypatch):
    monkeypatch.setenv("EPP_COMMIT", "ABCDEF1234567")
    async with EppServer(loopback_options(namespace="team-a"), seed=0) as server:
        await _route(server, 2)
        _, text = await _get(server, "/metrics")
    picks = _samples(text, "inference_extension_scheduler_attempts_total")
    # Counters are per process: this server's two picks are the only ones in team-a.
    assert sum(s.value for s in picks if s.labels["namespace"] == "team-a") == 2
    assert all(s.labels["namespace"] == "" for s in picks if s.labels["status"] == "failure")
    [info] = _samples(text, "inference_extension_info")
    assert info.labels["commit"] == "abcdef1234567"  # normalised to lowercase
    points = {s.labels["extension_point"] for s in _samples(
        text, "inference_extension_plugin_duration_seconds_count")}  # fmt: skip
    assert {"PrepareData", "ProfilePicker", "Scorer", "Picker"} <= points
    assert {"ProcessProfilesResults", "PreRequest"} <= points


def test_commit_from_env_git_or_unknown(monkeypatch, tmp_path):
    monkeypatch.setenv("EPP_COMMIT", "not a commit; $(rm -rf)")  # ignored, not trusted
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:  # a checkout: the package's own git HEAD
        assert build_commit() == head.stdout.strip()
    assert build_commit(source=tmp_path) == "unknown"  # no .git there
    monkeypatch.setenv("EPP_COMMIT", "0123abc")
    assert build_commit(source=tmp_path) == "0123abc"


def test_namespace_flag_rules(monkeypatch):
    p = argparse.ArgumentParser()
    add_arguments(p)
    monkeypatch.delenv("NAMESPACE", raising=False)
    opts, _ = options_from_args(p.parse_args(["--endpoint", "a=127.0.0.1:1"]))
    assert opts.namespace == "default"
    monkeypatch.setenv("NAMESPACE", "inference")  # the downward API in deploy/kubernetes
    opts, _ = options_from_args(p.parse_args(["--endpoint", "a=127.0.0.1:1"]))
    assert opts.namespace == "inference"


class CountingPostResponse:
    """A real PostResponse plugin (it only counts), to time that extension point."""

    type_name = "counting-post-response"
    name = "counter"

    def __init__(self) -> None:
        self.calls = 0

    def post_response(self, request, response, endpoint) -> None:
        self.calls += 1


def _post_response_count() -> float:
    value = REGISTRY.get_sample_value(
        "inference_extension_plugin_duration_seconds_count",
        {"extension_point": "PostResponse", "plugin_type": "counting-post-response",
         "plugin_name": "counter"},
    )  # fmt: skip
    return value or 0.0


def test_post_response_plugins_are_timed():
    plugin = CountingPostResponse()
    observer = ResponseObserver([plugin])
    target = snap("a")
    decision = RoutingDecision(["a"], result=SchedulingResult({"d": ProfileResult([target])}, "d"))
    record = RequestRecord(
        finished_at=1.0, isl=5, osl=3, ttft_ms=10.0, itl_ms=2.0, duration_s=0.1, endpoint="a"
    )
    before = _post_response_count()
    observer.finished(completion(), decision, record)
    observer.finished(completion(), decision, record)
    assert plugin.calls == 2
    assert _post_response_count() - before == 2
