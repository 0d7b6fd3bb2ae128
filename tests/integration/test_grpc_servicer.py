"""A real grpc.aio client drives the ext_proc servicer through whole streams."""

import asyncio
import json
import random

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp.config.loader import load_default_config
from epp.datastore import Datastore, Endpoint
from epp.director import Director
from epp.extproc.server import EXT_PROC_SERVICE, start_grpc_servers
from epp.headers import DESTINATION_ENDPOINT
from epp.scheduling.registry import Handle
from tests.eventually import eventually

MODES = processing_mode_pb2.ProcessingMode
BODY = json.dumps({"model": "m", "prompt": "tell me a story " * 50}).encode()


def headers(mode, eos=False, path="/v1/completions"):
    return pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[
                    base_pb2.HeaderValue(key=":path", raw_value=path.encode()),
                    base_pb2.HeaderValue(key=":method", raw_value=b"POST"),
                ]
            ),
            end_of_stream=eos,
        ),
        protocol_config=pb.ProtocolConfiguration(request_body_mode=mode),
    )


def chunks(body, n):
    size = -(-len(body) // n)
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    return [
        pb.ProcessingRequest(request_body=pb.HttpBody(body=p, end_of_stream=i == len(parts) - 1))
        for i, p in enumerate(parts)
    ]


@pytest.fixture
async def epp():
    ds = Datastore(require_metrics=False)
    ds.set_endpoints([Endpoint(f"e{i}", "127.0.0.1", 9000 + i) for i in range(3)])
    cfg = load_default_config(Handle(rng=random.Random(1)))
    director = Director(ds, cfg.scheduler, cfg.pre_request, random.Random(1))
    main, health, servicer, reporter, gport, hport = await start_grpc_servers(
        director, ds, "127.0.0.1", 0, 0
    )
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{gport}")
    yield ds, servicer, pb_grpc.ExternalProcessorStub(channel), hport, reporter
    await channel.close()
    await main.stop(None)
    await health.stop(None)


def open_stream(stub):
    """A stream fed message by message from a queue, so a test can stop mid-request."""
    queue: asyncio.Queue = asyncio.Queue()

    async def feed():
        while (item := await queue.get()) is not None:
            yield item

    return queue, stub.Process(feed())


async def run_stream(stub, messages):
    call = stub.Process(iter(messages))
    return [r async for r in call]


@pytest.mark.parametrize(
    ("mode", "n_chunks"),
    [
        (MODES.FULL_DUPLEX_STREAMED, 1),
        (MODES.FULL_DUPLEX_STREAMED, 4),
        (MODES.BUFFERED, 1),
        (MODES.STREAMED, 3),
    ],
)
async def test_whole_stream_in_each_body_mode(epp, mode, n_chunks):
    ds, servicer, stub, _, _ = epp
    responses = await run_stream(stub, [headers(mode), *chunks(BODY, n_chunks)])
    if mode == MODES.FULL_DUPLEX_STREAMED:
        assert responses[0].HasField("request_headers")
        mutation = responses[0].request_headers.response.header_mutation
        returned = b"".join(
            r.request_body.response.body_mutation.streamed_response.body for r in responses[1:]
        )
        assert returned == BODY
    elif mode == MODES.BUFFERED:
        assert [r.WhichOneof("response") for r in responses] == ["request_headers", "request_body"]
        mutation = responses[1].request_body.response.header_mutation
    else:
        kinds = [r.WhichOneof("response") for r in responses]
        assert kinds == ["request_headers"] + ["request_body"] * n_chunks
        mutation = responses[1].request_body.response.header_mutation
    dest = {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}[
        DESTINATION_ENDPOINT
    ]
    assert dest in {e.hostport for e in ds.endpoints()}
    await asyncio.sleep(0.05)
    assert servicer.open_streams == 0
    assert all(ds.inflight(e.name) == (0, 0) for e in ds.endpoints())


async def test_stream_cancelled_mid_body_leaks_nothing(epp):
    ds, servicer, stub, _, _ = epp
    queue, call = open_stream(stub)
    await queue.put(headers(MODES.FULL_DUPLEX_STREAMED))
    await queue.put(chunks(BODY, 4)[0])
    await eventually(lambda: servicer.open_streams == 1)
    assert servicer.open_streams == 1
    call.cancel()
    await eventually(lambda: servicer.open_streams == 0)
    assert servicer.open_streams == 0
    assert all(ds.inflight(e.name) == (0, 0) for e in ds.endpoints())


async def test_stream_cancelled_after_routing_releases_inflight(epp):
    ds, servicer, stub, _, _ = epp
    queue, call = open_stream(stub)
    await queue.put(headers(MODES.FULL_DUPLEX_STREAMED))
    await queue.put(chunks(BODY, 1)[0])
    first = await call.read()
    assert first.HasField("request_headers")
    assert sum(ds.inflight(e.name)[0] for e in ds.endpoints()) == 1  # held while in flight
    call.cancel()
    await eventually(
        lambda: (
            servicer.open_streams == 0 and sum(ds.inflight(e.name)[0] for e in ds.endpoints()) == 0
        )
    )
    assert servicer.open_streams == 0
    assert all(ds.inflight(e.name) == (0, 0) for e in ds.endpoints())


async def test_malformed_body_gets_immediate_400_and_server_keeps_serving(epp):
    _, _, stub, _, _ = epp
    (resp,) = await run_stream(
        stub,
        [
            headers(MODES.FULL_DUPLEX_STREAMED),
            pb.ProcessingRequest(request_body=pb.HttpBody(body=b"{x", end_of_stream=True)),
        ],
    )
    assert resp.immediate_response.status.code == 400
    ok = await run_stream(stub, [headers(MODES.FULL_DUPLEX_STREAMED), *chunks(BODY, 1)])
    assert ok[0].HasField("request_headers")


async def test_health_service_serving_once_endpoints_known(epp):
    ds, _, _, hport, reporter = epp
    async with grpc.aio.insecure_channel(f"127.0.0.1:{hport}") as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        r = await stub.Check(health_pb2.HealthCheckRequest(service=EXT_PROC_SERVICE))
        assert r.status == health_pb2.HealthCheckResponse.SERVING
        ds.set_endpoints([])
        await reporter.refresh()
        r = await stub.Check(health_pb2.HealthCheckRequest(service=EXT_PROC_SERVICE))
        assert r.status == health_pb2.HealthCheckResponse.NOT_SERVING
