"""The EPP's own /metrics carries the upstream names, types and labels."""

import json

import aiohttp
import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from epp.datastore import Endpoint
from epp.headers import MODEL_REWRITE
from epp.serve import EppServer, ServeOptions

EXPECTED = {
    "inference_pool_ready_pods": ("gauge", {"name"}),
    "inference_pool_average_kv_cache_utilization": ("gauge", {"name"}),
    "inference_pool_average_queue_size": ("gauge", {"name"}),
    "inference_pool_per_pod_queue_size": ("gauge", {"model_server_pod", "name"}),
    "inference_pool_average_running_requests": ("gauge", {"name"}),
    "inference_extension_scheduler_attempts": (
        "counter",
        {"status", "target_model_name", "pod_name", "namespace", "port"},
    ),
    "inference_extension_scheduler_e2e_duration_seconds": ("histogram", set()),
    "inference_extension_plugin_duration_seconds": (
        "histogram",
        {"extension_point", "plugin_type", "plugin_name"},
    ),
    "inference_extension_info": ("gauge", {"commit", "build_ref"}),
}


def parse(text: str) -> dict[str, tuple[str, list[dict[str, str]]]]:
    from prometheus_client.parser import text_string_to_metric_families

    return {
        f.name: (f.type, [s.labels for s in f.samples])
        for f in text_string_to_metric_families(text)
    }


def loopback_options(**extra: object) -> ServeOptions:
    """An in-process EPP on free loopback ports with two endpoints and no scraping."""
    return ServeOptions(
        host="127.0.0.1",
        grpc_port=0,
        health_port=0,
        metrics_port=0,
        scrape=False,
        endpoints=[Endpoint("e0", "127.0.0.1", 9000), Endpoint("e1", "127.0.0.1", 9001)],
        **extra,  # type: ignore[arg-type]
    )


def completion_stream(model: str, rewrite: str | None = None) -> list[pb.ProcessingRequest]:
    hdrs = [base_pb2.HeaderValue(key=":path", raw_value=b"/v1/completions")]
    if rewrite is not None:
        hdrs.append(base_pb2.HeaderValue(key=MODEL_REWRITE, raw_value=rewrite.encode()))
    body = json.dumps({"model": model, "prompt": "hi"}).encode()
    return [
        pb.ProcessingRequest(
            request_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=hdrs))
        ),
        pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True)),
    ]


async def test_metrics_have_upstream_names_types_and_labels():
    opts = loopback_options(pool_name="pool-a")
    async with EppServer(opts, seed=0) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as ch:
            stub = pb_grpc.ExternalProcessorStub(ch)
            msgs = completion_stream("m")
            replies = [r async for r in stub.Process(iter(msgs))]
            assert replies[0].HasField("request_headers")
        url = f"http://127.0.0.1:{server.metrics_port}/metrics"
        async with aiohttp.ClientSession() as s, s.get(url) as r:
            families = parse(await r.text())
    for name, (typ, labels) in EXPECTED.items():
        assert name in families, name
        got_type, samples = families[name]
        assert got_type == typ, name
        assert samples, f"{name} has no samples"
        assert set(samples[0]) - {"le"} == labels, name
    ready = families["inference_pool_ready_pods"][1]
    assert ready == [{"name": "pool-a"}]
    attempts = families["inference_extension_scheduler_attempts"][1]
    assert any(s["status"] == "success" and s["pod_name"] in ("e0", "e1") for s in attempts)
    plugin_types = {
        s["plugin_type"] for s in families["inference_extension_plugin_duration_seconds"][1]
    }
    # The default config (sticky until saturated): its filter, scorers and picker.
    assert {"prefix-cache-affinity-filter", "token-load-scorer", "max-score-picker"} <= plugin_types


async def test_client_model_names_never_grow_the_metrics_page():
    """1000 distinct junk model names (body and rewrite header) add a few series under the
    shared label "other", not 1000: unbounded, each 200-char name would add ≥ 200 bytes
    to several series, ≥ 1000 × 200 × 2 = 400 KB; bounded, the page grows by a few
    series (< 10 KB)."""
    async with EppServer(loopback_options(), seed=0) as server:
        for e in ("e0", "e1"):
            server.datastore.set_models(e, ["served-model"])
        url = f"http://127.0.0.1:{server.metrics_port}/metrics"
        async with aiohttp.ClientSession() as s:
            async with s.get(url) as r:
                before = len(await r.read())
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as ch:
                stub = pb_grpc.ExternalProcessorStub(ch)
                codes = []
                for i in range(1000):
                    junk = f"junk-{i:04d}-" + "x" * 190
                    # even i: unknown model → 404; odd i: rewritten to the served model → routed
                    msgs = completion_stream(junk, "served-model" if i % 2 else None)
                    (first, *_) = [r async for r in stub.Process(iter(msgs))]
                    codes.append(first.immediate_response.status.code)
            async with s.get(url) as r:
                text = await r.text()
    assert codes.count(404) == 500 and codes.count(0) == 500  # 0: routed, no immediate reply
    assert "junk-" not in text
    assert 'model_name="other"' in text
    assert len(text.encode()) - before < 10_000
