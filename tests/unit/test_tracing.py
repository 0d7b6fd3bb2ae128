"""Tracing (epp/tracing.py) with the SDK's in-memory exporter: the stages are spans under
one `gateway.request` span, the scheduler's plugins under its profile, the client's
trace is continued, and the model server is sent a traceparent naming the request span."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from epp.extproc.stream import RequestStream
from epp.tracing import build_tracer, instrument
from tests.unit.test_stream import BASE_HEADERS, BODY, body_msg, headers_msg, make_director

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_PARENT = f"00-{CLIENT_TRACE}-00f067aa0ba902b7-01"


@pytest.fixture
def traced(monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "1.0")
    exporter = InMemorySpanExporter()
    tracer = build_tracer(exporter)
    director, ds = make_director()
    instrument(director.scheduler)
    yield director, ds, tracer, exporter
    tracer.shutdown()


def set_headers(resp) -> dict[str, str]:
    mutation = resp.request_headers.response.header_mutation
    return {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}


def test_a_routed_request_is_one_trace_continuing_the_clients(traced):
    director, ds, tracer, exporter = traced
    s = RequestStream(director, 1 << 20, tracer=tracer)
    s.handle(headers_msg({**BASE_HEADERS, "traceparent": CLIENT_PARENT}))
    out = s.handle(body_msg(BODY, True))
    sent = set_headers(out[0])
    s.close()
    spans = {sp.name: sp for sp in exporter.get_finished_spans()}
    root = spans["gateway.request"]
    assert f"{root.context.trace_id:032x}" == CLIENT_TRACE  # the client's trace, continued
    assert root.parent is not None and root.parent.span_id == 0x00F067AA0BA902B7
    # the model server continues it under the request span
    assert sent["traceparent"] == f"00-{CLIENT_TRACE}-{root.context.span_id:016x}-01"
    for name in ("llm_d.epp.parse", "gateway.request_orchestration"):
        assert spans[name].parent.span_id == root.context.span_id
    orch = spans["gateway.request_orchestration"]
    profile = spans["run_scheduler_profile"]
    assert profile.parent.span_id == orch.context.span_id
    assert profile.attributes["llm_d.epp.scheduling.profile.name"]
    profile_children = {
        sp.name
        for sp in exporter.get_finished_spans()
        if sp.parent and sp.parent.span_id == profile.context.span_id
    }
    assert "pick_endpoints" in profile_children
    scorers = [
        sp for sp in exporter.get_finished_spans() if sp.name.startswith("llm_d.epp.scorer.")
    ]
    assert scorers and all(
        sp.parent.span_id == spans["llm_d.epp.scoring"].context.span_id for sp in scorers
    )
    assert all("llm_d.epp.scorer.weight" in sp.attributes for sp in scorers)
    # every child lies within its parent's time
    by_id = {sp.context.span_id: sp for sp in exporter.get_finished_spans()}
    for sp in exporter.get_finished_spans():
        if sp.parent is not None and sp.parent.span_id in by_id:
            p = by_id[sp.parent.span_id]
            assert p.start_time <= sp.start_time <= sp.end_time <= p.end_time, sp.name
    assert root.attributes["llm_d.epp.target_endpoint"] == sent["x-gateway-destination-endpoint"]
    assert all(ds.inflight(e.name) == (0, 0) for e in ds.endpoints())


def test_a_refused_request_ends_its_trace_with_the_status(traced):
    director, _, tracer, exporter = traced
    s = RequestStream(director, 1 << 20, tracer=tracer)
    s.handle(headers_msg(BASE_HEADERS))
    (resp,) = s.handle(body_msg(b"{not json", True))
    assert resp.immediate_response.status.code == 400
    s.close()
    (root,) = [sp for sp in exporter.get_finished_spans() if sp.name == "gateway.request"]
    assert root.attributes["http.response.status_code"] == 400
    assert "traceparent" not in BASE_HEADERS


@pytest.mark.parametrize(
    ("ratio", "parent", "traced"),
    [
        ("0", None, False),  # a root that drew over the ratio
        ("1.0", None, True),
        ("0", CLIENT_PARENT, True),  # a sampled parent is followed whatever the ratio
        ("1.0", CLIENT_PARENT[:-2] + "00", False),  # so is an unsampled one
        ("0", "garbage", False),  # unreadable: a new root, by the ratio
    ],
)
def test_sampling_is_parent_based_then_by_ratio(monkeypatch, ratio, parent, traced):
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", ratio)
    exporter = InMemorySpanExporter()
    tracer = build_tracer(exporter)
    director, _ = make_director()
    instrument(director.scheduler)
    s = RequestStream(director, 1 << 20, tracer=tracer)
    headers = BASE_HEADERS if parent is None else {**BASE_HEADERS, "traceparent": parent}
    s.handle(headers_msg(headers))
    out = s.handle(body_msg(BODY, True))
    s.close()
    assert bool(exporter.get_finished_spans()) is traced
    # untraced: nothing set, a client's own traceparent goes on unchanged through Envoy
    assert ("traceparent" in set_headers(out[0])) is traced


def test_without_a_tracer_no_traceparent_is_added():
    director, _ = make_director()
    s = RequestStream(director, 1 << 20)
    s.handle(headers_msg(BASE_HEADERS))
    out = s.handle(body_msg(BODY, True))
    assert "traceparent" not in set_headers(out[0])
