"""A plugin that raises (or breaks its contract) costs its request a 500 with an
OpenAI-style body, through the real grpc.aio servicer; the stream ends cleanly, nothing
stays held and the next request on the same server is routed."""

import json
import random

import grpc
import pytest
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from epp.datastore import Datastore, Endpoint
from epp.director import Director
from epp.extproc.server import start_grpc_servers
from epp.scheduling.interfaces import Plugin
from epp.scheduling.profile import SchedulerProfile, WeightedScorer
from epp.scheduling.scheduler import Scheduler
from tests.eventually import eventually
from tests.helpers import plugin
from tests.integration.test_grpc_servicer import BODY, chunks, headers, run_stream

MODES = processing_mode_pb2.ProcessingMode


class Faulty(Plugin):
    """Every extension point at once; `fault` says how it misbehaves, None = it works."""

    type_name = "faulty"
    produces = "faulty-data"

    def __init__(self, at: str) -> None:
        super().__init__(f"faulty-{at}")
        self.at = at
        self.fault: str | None = None

    def _maybe_fail(self, point: str) -> None:
        if self.fault == "raise" and self.at == point:
            raise KeyError("boom")

    def produce(self, state, request, endpoints):
        self._maybe_fail("producer")
        return None

    def filter(self, state, request, endpoints):
        self._maybe_fail("filter")
        return endpoints

    def score(self, state, request, endpoints):
        self._maybe_fail("scorer")
        if self.fault == "short" and self.at == "scorer":
            return [0.5] * (len(endpoints) - 1)  # one score missing
        return [0.5] * len(endpoints)


class FaultyHandler(Faulty):
    def __init__(self) -> None:
        super().__init__("handler")
        self.inner = plugin("single-profile-handler")

    def pick_profiles(self, state, request, profiles, results):
        self._maybe_fail("handler")
        return self.inner.pick_profiles(state, request, profiles, results)

    def process_results(self, state, request, results):
        return self.inner.process_results(state, request, results)


@pytest.fixture
async def faulty_epp():
    ds = Datastore(require_metrics=False)
    ds.set_endpoints([Endpoint(f"e{i}", "127.0.0.1", 9100 + i) for i in range(3)])
    parts = {at: Faulty(at) for at in ("producer", "filter", "scorer")}
    handler = FaultyHandler()
    profile = SchedulerProfile(
        "default",
        [parts["filter"]],
        [WeightedScorer(parts["scorer"], 1.0)],
        plugin("max-score-picker"),
    )
    scheduler = Scheduler(handler, {"default": profile}, [parts["producer"]])
    director = Director(ds, scheduler, (), random.Random(1))
    main, health, servicer, _, gport, _ = await start_grpc_servers(director, ds, "127.0.0.1", 0, 0)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{gport}")
    yield ds, servicer, pb_grpc.ExternalProcessorStub(channel), {**parts, "handler": handler}
    await channel.close()
    await main.stop(None)
    await health.stop(None)


@pytest.mark.parametrize(
    ("at", "fault", "problem"),
    [
        ("producer", "raise", "KeyError"),
        ("filter", "raise", "KeyError"),
        ("scorer", "raise", "KeyError"),
        ("handler", "raise", "KeyError"),
        ("scorer", "short", "returned 2 scores for 3 endpoints"),
    ],
)
async def test_a_faulty_plugin_gets_its_request_a_500_and_nothing_else(
    faulty_epp, at, fault, problem
):
    ds, servicer, stub, parts = faulty_epp
    parts[at].fault = fault
    responses = await run_stream(stub, [headers(MODES.FULL_DUPLEX_STREAMED), *chunks(BODY, 2)])
    (resp,) = responses
    assert resp.immediate_response.status.code == 500
    error = json.loads(resp.immediate_response.body)["error"]
    assert error["type"] == "internal_error" and error["code"] == "internal_error"
    assert f"plugin faulty-{at}/faulty failed: {problem}" in error["message"]
    assert "boom" not in error["message"]  # the exception's text stays in the EPP log
    assert all(ds.inflight(e.name) == (0, 0) for e in ds.endpoints())

    parts[at].fault = None  # the same server routes the next request
    ok = await run_stream(stub, [headers(MODES.FULL_DUPLEX_STREAMED), *chunks(BODY, 1)])
    assert ok[0].HasField("request_headers")
    await eventually(lambda: servicer.open_streams == 0)
    assert servicer.open_streams == 0
