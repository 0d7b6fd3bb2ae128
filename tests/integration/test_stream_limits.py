"""Server-wide limits over a real gRPC stream (issue 13 §1c): a body that never ends is
answered 408 and freed; the body budget spans streams and is given back."""

import asyncio
import json
import random

import grpc
import pytest
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from epp.config.loader import load_default_config
from epp.datastore import Datastore, Endpoint
from epp.director import Director
from epp.extproc.server import StreamLimits, start_grpc_servers
from epp.scheduling.registry import Handle
from tests.eventually import eventually
from tests.integration.test_grpc_servicer import headers, open_stream

FULL_DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED


@pytest.fixture
async def limited():
    ds = Datastore(require_metrics=False)
    ds.set_endpoints([Endpoint("e0", "127.0.0.1", 9000)])
    cfg = load_default_config(Handle(rng=random.Random(1)))
    director = Director(ds, cfg.scheduler, cfg.pre_request, random.Random(1))
    # body_timeout 0.5 s: the test waits for the 408, it never measures how long it took
    limits = StreamLimits(max_body_bytes=10_000, max_buffered_bytes=15_000, body_timeout=0.5)
    main, health, servicer, _, gport, _ = await start_grpc_servers(
        director, ds, "127.0.0.1", 0, 0, limits=limits
    )
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{gport}")
    yield ds, servicer, pb_grpc.ExternalProcessorStub(channel)
    await channel.close()
    await main.stop(None)
    await health.stop(None)


def chunk(data: bytes, eos: bool = False) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=data, end_of_stream=eos))


async def test_a_body_that_never_ends_gets_408_and_its_bytes_are_freed(limited):
    ds, servicer, stub = limited
    queue, call = open_stream(stub)
    await queue.put(headers(FULL_DUPLEX))
    await queue.put(chunk(b'{"model": "m", "prompt": "slow'))
    resp = await call.read()  # the only answer: the stream is then ended by the EPP
    assert resp.immediate_response.status.code == 408
    assert json.loads(resp.immediate_response.body)["error"]["code"] == "request_timeout"
    await eventually(lambda: servicer.open_streams == 0)
    assert (servicer.open_streams, servicer.budget.held) == (0, 0)
    assert ds.inflight("e0") == (0, 0)
    await queue.put(None)


async def test_the_budget_spans_streams_and_a_finished_stream_gives_it_back(limited):
    ds, servicer, stub = limited
    q1, c1 = open_stream(stub)
    await q1.put(headers(FULL_DUPLEX))
    await q1.put(chunk(b" " * 9_000))
    await eventually(lambda: servicer.budget.held == 9_000)
    assert servicer.budget.held == 9_000
    q2, c2 = open_stream(stub)
    await q2.put(headers(FULL_DUPLEX))
    await q2.put(chunk(b" " * 7_000))  # 9,000 + 7,000 > 15,000
    resp = await c2.read()
    assert resp.immediate_response.status.code == 503
    await q2.put(None)
    await q1.put(chunk(b'{"model": "m", "prompt": "x"}', eos=True))
    first = await c1.read()
    assert first.WhichOneof("response") == "request_headers"
    assert servicer.budget.held == 0
    await q1.put(None)
    await asyncio.gather(eventually(lambda: servicer.open_streams == 0))
    assert servicer.open_streams == 0
    assert ds.inflight("e0") == (0, 0)
