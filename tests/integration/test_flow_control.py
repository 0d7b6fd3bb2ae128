"""Flow control on the event loop: release order, 429/503 with OpenAI bodies, and a client
that disconnects while queued (a real grpc.aio stream into an in-process EPP).

The pool is one endpoint with `concurrency-detector` maxConcurrency 1: one routed
request in flight = saturation 1/1 = saturated, so a second request must wait. The
tests let capacity free by hand (`Datastore.release` + `capacity_freed`, exactly what
`Director.release` does), so order is decided by the queue, not by timing.
"""

import asyncio
import json
import random

import aiohttp
import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from prometheus_client.parser import text_string_to_metric_families

from epp.admission import Objectives
from epp.composition import install_plugins
from epp.config.loader import load_config_text
from epp.datastore import Datastore, Endpoint
from epp.errors import EppError
from epp.flowcontrol import metrics as fm
from epp.flowcontrol.config import FlowControlConfig
from epp.flowcontrol.controller import FlowController, effective_ttl
from epp.flowcontrol.queue import EDF, BandLimits
from epp.headers import FAIRNESS_ID, INFERENCE_TTL, OBJECTIVE
from epp.request import new_request, parse_body
from epp.scheduling.registry import Handle
from epp.serve import EppServer, ServeOptions
from tests.eventually import eventually
from tests.helpers import plugin

OBJECTIVES = Objectives({"critical": 10, "normal": 0, "batch": -1})


def setup(
    cfg: FlowControlConfig | None = None, max_concurrency: int = 1
) -> tuple[FlowController, Datastore]:
    ds = Datastore(require_metrics=False)
    ds.set_endpoints([Endpoint("a", "127.0.0.1", 8000)])
    detector = plugin("concurrency-detector", {"maxConcurrency": max_concurrency})
    return FlowController(cfg or FlowControlConfig(), detector, ds, OBJECTIVES, "pool-t"), ds


def req(objective: str, fairness: str | None = None, **extra: str):
    headers = {OBJECTIVE: objective} | ({FAIRNESS_ID: fairness} if fairness else {})
    headers |= {k.replace("_", "-"): v for k, v in extra.items()}
    return parse_body(
        new_request(headers, "/v1/completions", "POST"), b'{"model":"m","prompt":"hi"}'
    )


async def settle() -> None:
    """Let every ready callback and task run (dispatch → future → waiter → route)."""
    for _ in range(20):
        await asyncio.sleep(0)


def openai_error(e: EppError) -> dict:
    return json.loads(e.body())["error"]


async def test_release_order_is_priority_then_round_robin_one_at_a_time():
    fc, ds = setup()
    ds.acquire("a")  # saturated: 1 of 1
    order: list[str] = []

    async def client(tag: str, objective: str, fairness: str) -> None:
        await fc.acquire(req(objective, fairness), 100)
        order.append(tag)
        ds.acquire("a")  # routed at once, as RequestStream does: in flight again

    arrivals = [
        ("n-t1-1", "normal", "t1"),
        ("n-t1-2", "normal", "t1"),
        ("n-t1-3", "normal", "t1"),
        ("n-t2-1", "normal", "t2"),
        ("c-t1-1", "critical", "t1"),
        ("c-t2-1", "critical", "t2"),
        ("c-t1-2", "critical", "t1"),
    ]
    tasks = []
    for a in arrivals:
        tasks.append(asyncio.create_task(client(*a)))
        await settle()
    assert (len(fc.queue), order) == (7, [])
    for i in range(7):
        ds.release("a")
        fc.capacity_freed()
        await settle()
        assert len(order) == i + 1  # exactly one per freed slot
    await asyncio.gather(*tasks)
    # critical band first (round robin t1, t2, t1), then normal (t1, t2, t1, t1)
    assert order == [
        "c-t1-1",
        "c-t2-1",
        "c-t1-2",
        "n-t1-1",
        "n-t2-1",
        "n-t1-2",
        "n-t1-3",
    ]
    assert len(fc.queue) == 0


async def test_free_pool_lets_requests_straight_through():
    fc, _ = setup()
    await fc.acquire(req("batch"), 10)  # 0 of 1 in flight: even sheddable passes
    await fc.acquire(req("normal"), 10)
    assert len(fc.queue) == 0


async def test_sheddable_gets_429_at_once_while_saturated():
    fc, ds = setup()
    ds.acquire("a")
    with pytest.raises(EppError) as e:
        await fc.acquire(req("batch"), 10)
    assert e.value.status == 429
    err = openai_error(e.value)
    assert err["type"] == "rate_limit_error" and "sheddable (priority -1)" in err["message"]
    assert "saturated (1.00 by concurrency-detector;" in err["message"]
    assert len(fc.queue) == 0


async def test_holdback_sheds_sheddable_below_full_saturation_and_keeps_room_for_others():
    fc, ds = setup(FlowControlConfig(ceiling=1.0, sheddable_ceiling=0.5), max_concurrency=4)
    ds.acquire("a")
    await fc.acquire(req("batch"), 10)  # 1 of 4 in flight = 0.25 < 0.5: passes
    ds.acquire("a")
    with pytest.raises(EppError) as e:  # 2 of 4 = 0.5, not below 0.5: shed
        await fc.acquire(req("batch"), 10)
    assert e.value.status == 429 and "sheddable requests pass below 0.5" in e.value.message
    await fc.acquire(req("normal"), 10)  # 0.5 < 1.0: priority >= 0 goes straight on
    assert len(fc.queue) == 0


async def test_full_queue_gets_429_with_an_openai_body():
    fc, ds = setup(FlowControlConfig(max_requests=2))
    ds.acquire("a")
    waiting = [asyncio.create_task(fc.acquire(req("normal"), 10)) for _ in range(2)]
    await settle()
    with pytest.raises(EppError) as e:
        await fc.acquire(req("critical"), 10)
    assert e.value.status == 429
    err = openai_error(e.value)
    assert err["type"] == "rate_limit_error"
    assert "holds its maximum of 2 requests" in err["message"]
    for t in waiting:
        t.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
    assert len(fc.queue) == 0


async def test_waiting_past_the_ttl_gets_503_with_an_openai_body():
    fc, ds = setup(FlowControlConfig(ttl=0.01))
    ds.acquire("a")  # never released: the request can only expire
    with pytest.raises(EppError) as e:
        await fc.acquire(req("normal"), 10)
    assert e.value.status == 503
    err = openai_error(e.value)
    assert err["type"] == "service_unavailable" and "waited 0.01s" in err["message"]
    assert (len(fc.queue), fc.queue.bytes) == (0, 0)


def test_the_ttl_header_can_shorten_the_configured_ttl_but_never_lengthen_it():
    def eff(value: str | None, default: float = 30.0) -> float:
        extra = {"x_llm_d_inference_ttl": value} if value is not None else {}
        return effective_ttl(req("normal", **extra), default)

    assert INFERENCE_TTL == "x-llm-d-inference-ttl"  # llm-d-router's name
    assert eff(None) == 30.0
    assert eff(" 2s ") == 2.0  # trimmed, as upstream
    assert eff("1m30s") == 30.0  # 90 s asked, bounded by the configured 30 s
    assert eff("90s", default=0.0) == 90.0  # no configured bound: the header alone
    for bad in ("soon", "0s", "-1s", "5", ""):
        assert eff(bad) == 30.0, bad  # ignored: the default applies


async def test_a_request_with_a_short_ttl_header_expires_first_and_says_why():
    fc, ds = setup(FlowControlConfig(ttl=30.0))
    ds.acquire("a")  # never released
    patient = asyncio.create_task(fc.acquire(req("normal"), 10))
    with pytest.raises(EppError) as e:
        await fc.acquire(req("normal", x_llm_d_inference_ttl="10ms"), 10)
    assert e.value.status == 503
    assert "waited 0.01s" in e.value.message and "x-llm-d-inference-ttl header" in e.value.message
    assert not patient.done() and len(fc.queue) == 1  # the other one waits on (30 s)
    patient.cancel()
    await asyncio.gather(patient, return_exceptions=True)


async def test_edf_band_releases_the_earliest_deadline_first():
    fc, ds = setup(FlowControlConfig(ttl=60.0, default_band=BandLimits(ordering=EDF)))
    ds.acquire("a")  # saturated
    order: list[str] = []

    async def client(tag: str, ttl: str | None) -> None:
        extra = {"x_llm_d_inference_ttl": ttl} if ttl else {}
        await fc.acquire(req("normal", **extra), 10)
        order.append(tag)
        ds.acquire("a")

    # arrive in this order; deadlines: none → 60 s (the default), 20 s, 5 s, 20 s
    tasks = []
    for tag, ttl in (("default", None), ("20s-a", "20s"), ("5s", "5s"), ("20s-b", "20s")):
        tasks.append(asyncio.create_task(client(tag, ttl)))
        await settle()
    for _ in range(4):
        ds.release("a")
        fc.capacity_freed()
        await settle()
    await asyncio.gather(*tasks)
    assert order == ["5s", "20s-a", "20s-b", "default"]


def evicted_cancelled() -> float:
    total = 0.0
    for fam in fm.QUEUE_DURATION.collect():
        for s in fam.samples:
            if s.name.endswith("_count") and s.labels["outcome"] == fm.EVICTED_CANCELLED:
                total += s.value
    return total


async def test_a_cancelled_waiter_leaves_the_queue_and_the_next_one_gets_its_turn():
    fc, ds = setup()
    ds.acquire("a")
    before = evicted_cancelled()
    first = asyncio.create_task(fc.acquire(req("normal"), 10))
    second = asyncio.create_task(fc.acquire(req("normal"), 10))
    await settle()
    assert len(fc.queue) == 2
    first.cancel()
    await settle()
    assert len(fc.queue) == 1 and evicted_cancelled() == before + 1
    ds.release("a")
    fc.capacity_freed()
    await asyncio.wait_for(second, 5)  # the cancelled one did not take the freed slot
    assert len(fc.queue) == 0


# --- through gRPC, in-process EPP --------------------------------------------------------

CONFIG = """\
featureGates: [flowControl]
plugins:
- {type: concurrency-detector, parameters: {maxConcurrency: 1}}
- type: queue-scorer
saturationDetector: {pluginRef: concurrency-detector}
flowControl: {defaultRequestTTL: 0}
"""


def request_messages() -> list[pb.ProcessingRequest]:
    hdrs = [base_pb2.HeaderValue(key=":path", raw_value=b"/v1/completions")]
    mode = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
    return [
        pb.ProcessingRequest(
            request_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=hdrs)),
            protocol_config=pb.ProtocolConfiguration(request_body_mode=mode),
        ),
        pb.ProcessingRequest(
            request_body=pb.HttpBody(body=b'{"model":"m","prompt":"hi"}', end_of_stream=True)
        ),
    ]


def open_stream(stub):
    queue: asyncio.Queue = asyncio.Queue()

    async def feed():
        while (item := await queue.get()) is not None:
            yield item

    return queue, stub.Process(feed())


@pytest.fixture
async def epp_server():
    config = load_config_text(CONFIG, "fc.yaml", Handle(rng=random.Random(0)), install_plugins())
    opts = ServeOptions(
        host="127.0.0.1",
        grpc_port=0,
        health_port=0,
        metrics_port=0,
        scrape=False,
        endpoints=[Endpoint("e0", "127.0.0.1", 9000)],
        # These tests play Envoy's ext_proc side themselves, in-path: a routed stream's
        # end is its request's end (no access log here).
        response_log=False,
    )
    async with (
        EppServer(opts, config, seed=0) as server,
        grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as ch,
    ):
        yield server, pb_grpc.ExternalProcessorStub(ch)


async def test_a_client_that_disconnects_while_queued_leaves_the_queue(epp_server):
    server, stub = epp_server
    server.datastore.set_models("e0", ["m"])  # a served model is a label value (else "other")
    fc = server.director.flow_control
    # 1: routed and still open (its response has not ended): the pool is saturated.
    q1, call1 = open_stream(stub)
    for m in request_messages():
        await q1.put(m)
    first = await call1.read()
    assert first.HasField("request_headers")
    # 2: waits in the queue; then its client goes away (Envoy resets the ext_proc stream).
    q2, call2 = open_stream(stub)
    for m in request_messages():
        await q2.put(m)
    await eventually(lambda: len(fc.queue) == 1)
    call2.cancel()
    await eventually(lambda: len(fc.queue) == 0)
    assert fc.queue.bytes == 0
    # 3: waits, and is routed as soon as stream 1 ends (its in-flight count is released).
    q3, call3 = open_stream(stub)
    for m in request_messages():
        await q3.put(m)
    await eventually(lambda: len(fc.queue) == 1)
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        families = {f.name: f for f in text_string_to_metric_families(await r.text())}
    (waiting,) = families["inference_extension_flow_control_queue_size"].samples
    assert waiting.value == 1 and waiting.labels == {
        "fairness_id": "default-flow",
        "priority": "0",
        "inference_pool": "default",
        "model_name": "m",
        "target_model_name": "m",
    }
    (held,) = families["inference_extension_flow_control_queue_bytes"].samples
    assert held.value == len(b'{"model":"m","prompt":"hi"}')  # the raw body: 27 bytes
    (sat,) = families["inference_extension_flow_control_pool_saturation"].samples
    assert sat.value == 1.0  # 1 in flight / (maxConcurrency 1 × 1 endpoint)
    await q1.put(None)  # stream 1 ends
    third = await asyncio.wait_for(call3.read(), 10)
    assert third.HasField("request_headers")
    assert len(fc.queue) == 0
    await q3.put(None)
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        text = await r.text()
    for name in (
        "inference_extension_flow_control_request_queue_duration_seconds_bucket",
        "inference_extension_flow_control_request_enqueue_duration_seconds_bucket",
        "inference_extension_flow_control_dispatch_cycle_duration_seconds_bucket",
        "inference_extension_flow_control_pool_saturation{",
        "# TYPE inference_extension_flow_control_queue_size gauge",
        "# TYPE inference_extension_flow_control_queue_bytes gauge",
    ):
        assert name in text, name
    assert 'outcome="EvictedContextCancelled"' in text
    assert 'fairness_id="default-flow"' in text


async def test_the_session_key_is_the_flow_when_the_request_names_no_fairness_id():
    """Agent sessions (their session header, llm-d's agent identity) share the queue round
    robin like fairness ids do; an explicit fairness id still wins over the session."""
    fc, ds = setup()
    ds.acquire("a")  # saturated: 1 of 1
    order: list[str] = []

    def session_req(session: str, fairness: str | None = None):
        return req("normal", fairness, x_claude_code_session_id=session)

    async def client(tag: str, request) -> None:
        await fc.acquire(request, 100)
        order.append(tag)
        ds.acquire("a")

    arrivals = [
        ("s1-1", session_req("s1")),
        ("s1-2", session_req("s1")),
        ("s1-3", session_req("s1")),
        ("s2-1", session_req("s2")),
        ("t-1", session_req("s3", fairness="s1")),  # the fairness id: flow s1
    ]
    tasks = []
    for tag, request in arrivals:
        tasks.append(asyncio.create_task(client(tag, request)))
        await settle()
    for _ in arrivals:
        ds.release("a")
        fc.capacity_freed()
        await settle()
    await asyncio.gather(*tasks)
    # flows s1 (4 requests) and s2 (1) take turns: s1, s2, then the rest of s1
    assert order == ["s1-1", "s2-1", "s1-2", "s1-3", "t-1"]
