"""The response phases over a real grpc.aio connection: in-flight ends with the response
(not with the gRPC stream), the observer gets one record, cancellation mid-response
gives everything back, and an Envoy that skips the response phases is reported once."""

import json
import logging
import random

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from epp.completion import ResponseObserver
from epp.config.loader import load_default_config
from epp.datastore import Datastore, Endpoint
from epp.director import Director
from epp.extproc.server import start_grpc_servers
from epp.scheduling.registry import Handle
from tests.eventually import eventually
from tests.integration.test_grpc_servicer import MODES, chunks, headers, open_stream

BODY = json.dumps({"model": "m", "prompt": "tell me a story", "stream": True}).encode()


@pytest.fixture
async def epp():
    ds = Datastore(require_metrics=False)
    ds.set_endpoints([Endpoint("e0", "127.0.0.1", 9000)])
    cfg = load_default_config(Handle(rng=random.Random(1)))
    director = Director(ds, cfg.scheduler, cfg.pre_request, random.Random(1))
    records: list = []
    main, health, servicer, _, gport, _ = await start_grpc_servers(
        director, ds, "127.0.0.1", 0, 0, observer=ResponseObserver(sinks=[records.append])
    )
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{gport}")
    yield ds, servicer, pb_grpc.ExternalProcessorStub(channel), records
    await channel.close()
    await main.stop(None)
    await health.stop(None)


def request_headers():
    msg = headers(MODES.FULL_DUPLEX_STREAMED)
    msg.protocol_config.response_body_mode = MODES.FULL_DUPLEX_STREAMED
    return msg


def response_headers():
    hdrs = {":status": "200", "content-type": "text/event-stream"}
    return pb.ProcessingRequest(
        response_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in hdrs.items()]
            )
        )
    )


def sse_chunk(text: str, eos: bool = False) -> pb.ProcessingRequest:
    data = b'data: {"choices": [{"text": "%s"}]}\n\n' % text.encode()
    return pb.ProcessingRequest(response_body=pb.HttpBody(body=data, end_of_stream=eos))


async def routed(stub, ds):
    queue, call = open_stream(stub)
    await queue.put(request_headers())
    await queue.put(chunks(BODY, 1)[0])
    assert (await call.read()).HasField("request_headers")
    assert (await call.read()).HasField("request_body")
    assert ds.inflight("e0")[0] == 1
    return queue, call


async def test_inflight_ends_with_the_response_not_the_stream(epp):
    ds, servicer, stub, records = epp
    queue, call = await routed(stub, ds)
    await queue.put(response_headers())
    assert (await call.read()).HasField("response_headers")
    sent = [sse_chunk("a"), sse_chunk("b"), sse_chunk("c", eos=True)]
    for msg in sent:
        await queue.put(msg)
        back = await call.read()
        # Each chunk comes back at once, with the same bytes.
        mutation = back.response_body.response.body_mutation.streamed_response
        assert (mutation.body, mutation.end_of_stream) == (
            msg.response_body.body,
            msg.response_body.end_of_stream,
        )
    # The response ended; the gRPC stream is still open, the counts are already back.
    assert servicer.open_streams == 1
    assert ds.inflight("e0") == (0, 0)
    (rec,) = records
    assert (rec.ok, rec.osl, rec.status, rec.endpoint) == (True, 3, 200, "e0")
    await queue.put(None)
    await eventually(lambda: servicer.open_streams == 0)
    assert len(records) == 1 and ds.inflight("e0") == (0, 0)


async def test_cancelled_mid_response_releases_and_reports_failure(epp):
    ds, servicer, stub, records = epp
    queue, call = await routed(stub, ds)
    await queue.put(response_headers())
    await call.read()
    await queue.put(sse_chunk("a"))
    await call.read()
    assert ds.inflight("e0")[0] == 1
    call.cancel()  # what Envoy does when the client goes away
    await eventually(lambda: servicer.open_streams == 0 and ds.inflight("e0") == (0, 0))
    assert ds.inflight("e0") == (0, 0)
    (rec,) = records
    assert (rec.ok, rec.osl) == (False, 1)


async def test_envoy_without_response_phases_is_reported_once(epp, caplog):
    ds, servicer, stub, _ = epp
    caplog.set_level(logging.WARNING, logger="epp.extproc")
    for _ in range(2):
        queue, _ = await routed(stub, ds)
        await queue.put(None)  # Envoy half-closes right after routing (phases skipped)
        await eventually(lambda: servicer.open_streams == 0)
    warnings = [r for r in caplog.records if "sent no response phases" in r.getMessage()]
    assert len(warnings) == 1
    assert ds.inflight("e0") == (0, 0)
