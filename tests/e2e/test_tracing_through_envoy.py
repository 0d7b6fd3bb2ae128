"""Tracing end to end: client → Envoy → `epp serve --tracing` → simulator, with the spans
exported over OTLP/gRPC to a receiver on loopback. The receiver is the OTLP proto's own
TraceService on a grpc.aio server (no collector binary is installed here); the exporter,
Envoy, the EPP and the simulator are the real ones."""

from __future__ import annotations

import asyncio

import aiohttp
import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as ts
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as ts_grpc

from epp.harness.localstack import LocalStack
from epp.headers import SIM_TRACEPARENT

TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_PARENT = f"00-{TRACE}-b7ad6b7169203331-01"


class Receiver(ts_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans: list = []

    async def Export(self, request, context):
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                self.spans.extend(ss.spans)
        return ts.ExportTraceServiceResponse()


async def test_spans_reach_an_otlp_receiver_and_the_server_continues_the_trace(monkeypatch):
    receiver = Receiver()
    server = grpc.aio.server()
    ts_grpc.add_TraceServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "1.0")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    try:
        # The in-path response mode: the response passes the EPP, so its span is there too
        # (with the access-log path the EPP's trace ends at routing: docs/observability.md).
        with LocalStack(
            n_sims=2,
            sim_args=["--decode-ms-per-token", "1"],
            epp_args=["--tracing"],
            response_path=True,
        ) as st:
            body = b'{"model": "tiny", "prompt": "trace me", "max_tokens": 3}'
            headers = {"content-type": "application/json", "traceparent": CLIENT_PARENT}
            async with aiohttp.ClientSession() as http:
                async with http.post(st.url + "/v1/completions", data=body, headers=headers) as r:
                    assert r.status == 200
                    await r.read()
                    at_server = r.headers[SIM_TRACEPARENT]
                untraced = await http.post(
                    st.url + "/v1/completions",
                    data=body,
                    headers={"content-type": "application/json"},
                )
                assert untraced.status == 200 and SIM_TRACEPARENT in untraced.headers
            _, trace_id, parent_span, flags = at_server.split("-")
            assert (trace_id, flags) == (TRACE, "01")  # the client's trace reached the server

            def ours():
                return [s for s in receiver.spans if s.trace_id.hex() == TRACE]

            for _ in range(300):  # the batch processor exports every 100 ms
                names = {s.name for s in ours()}
                if {"gateway.request", "llm_d.epp.response", "run_scheduler_profile"} <= names:
                    break
                await asyncio.sleep(0.1)
            spans = ours()
            names = {s.name for s in spans}
            assert {"gateway.request", "llm_d.epp.parse", "gateway.request_orchestration"} <= names
            assert {"run_scheduler_profile", "pick_endpoints", "llm_d.epp.response"} <= names
            (root,) = [s for s in spans if s.name == "gateway.request"]
            assert root.parent_span_id.hex() == "b7ad6b7169203331"
            assert root.span_id.hex() == parent_span  # the server's parent is the EPP's span
    finally:
        await server.stop(None)
