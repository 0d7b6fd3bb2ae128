"""The access-log response path (`--response-path log`) records what the in-path one
(`--response-path on`) records, on the same requests.

One real Envoy 1.40 runs both at once: the ext_proc filter sends every response chunk
through an `epp serve --response-path on` (whose records show in its
`inference_objective_*` histograms), and the Lua filter plus the gRPC access log of
deploy/envoy/envoy.yaml report the same response to an access-log server in this test,
which reads each entry with the EPP's own code (`read_entry`, `logged_meter`,
`build_record`). Requests go one at a time, so each histogram's change is one request's
value. Tolerances: tokens exact; TTFT: the in-path clock starts at the EPP's pick and
stops when the first token's chunk has reached the EPP and the EPP's loop took it; the
log's starts when the pick reached Envoy's Lua filter and stops when that filter sees the
chunk. So the log's TTFT is earlier by the chunk's hop to the EPP and the loop's wait
(below 1 ms on a quiet loopback, up to several ms on a loaded machine) and later by the
pick's hop back to Envoy: it may be 1 ms later, at most 10 ms (or 25 %) earlier. TPOT
(first to last token) has no hop in it: within 10 % or 1 ms."""

import asyncio
import copy
import math

import aiohttp
import grpc
import pytest
from envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc

from epp.extproc.access_log import logged_meter, read_entry
from epp.harness.envoy import (
    LISTENER_NAME,
    RESPONSE_LOGGER,
    EnvoyOptions,
    _connection_manager,
    _named,
    astart_envoy,
    load_template,
    render,
    response_meter_filter,
)
from epp.headers import ROUTE_ID
from tests.e2e.test_response_path import TIMEOUT, metric, wait_inflight_zero

pytestmark = pytest.mark.e2e

SIM_ARGS = ["--decode-ms-per-token", "15", "--prefill-ms-per-token", "0.05"]
# The log's TTFT is never later than the in-path one by more than clock noise, and earlier
# by at most the first chunk's hop to the EPP and the EPP's loop (a loaded machine: 10 ms).
TTFT_EARLY_MS = 1.0
TTFT_LATE_MS = 10.0


class Collector(als_pb2_grpc.AccessLogServiceServicer):
    def __init__(self) -> None:
        self.entries: asyncio.Queue = asyncio.Queue()

    async def StreamAccessLogs(self, request_iterator, context):
        async for msg in request_iterator:
            for entry in msg.http_logs.log_entry:
                await self.entries.put(entry)
        return als_pb2.StreamAccessLogsResponse()


def both_paths_config(options: EnvoyOptions, als_port: int) -> dict:
    """In-path ext_proc (options) plus the shipped Lua filter and access log, the log
    going to this test's server, for every request (the in-path EPP sets no route id)."""
    config = render(options)
    shipped = _connection_manager(
        _named(load_template()["static_resources"]["listeners"], LISTENER_NAME, "listener")
    )
    hcm = _connection_manager(_named(config["static_resources"]["listeners"], LISTENER_NAME, ""))
    logger = copy.deepcopy(_named(shipped["access_log"], RESPONSE_LOGGER, "access log"))
    logger.pop("filter")
    common = logger["typed_config"]["common_config"]
    common["grpc_service"]["envoy_grpc"]["cluster_name"] = "test_als"
    hcm["access_log"] = [logger]
    hcm["http_filters"].insert(len(hcm["http_filters"]) - 1, response_meter_filter())
    clusters = config["static_resources"]["clusters"]
    als = copy.deepcopy(_named(clusters, "ext_proc", "cluster"))  # HTTP/2, like any gRPC
    als.pop("health_checks")
    als["name"] = als["load_assignment"]["cluster_name"] = "test_als"
    [host] = als["load_assignment"]["endpoints"][0]["lb_endpoints"]
    host["endpoint"].pop("health_check_config")
    host["endpoint"]["address"]["socket_address"]["port_value"] = als_port
    clusters.append(als)
    return config


SERIES = {
    "ttft": "inference_objective_request_ttft_seconds_sum",
    "tpot": "inference_objective_request_tpot_seconds_sum",
    "tpot_n": "inference_objective_request_tpot_seconds_count",
    "isl": "inference_objective_input_tokens_sum",
    "osl": "inference_objective_output_tokens_sum",
    "cached": "inference_objective_prompt_cached_tokens_sum",
}

REQUESTS = [
    ("/v1/completions", {"prompt": "Tell me about logs.", "max_tokens": 24, "stream": True,
                         "stream_options": {"include_usage": True}}),
    ("/v1/completions", {"prompt": "Tell me about logs.", "max_tokens": 24, "stream": True,
                         "stream_options": {"include_usage": True}}),  # cached prefix now
    ("/v1/completions", {"prompt": "No usage asked for here.", "max_tokens": 16,
                         "stream": True}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Chat with me."}],
                              "max_tokens": 20, "stream": True,
                              "stream_options": {"include_usage": True}}),
    ("/v1/completions", {"prompt": "A JSON answer.", "max_tokens": 12}),
]  # fmt: skip


async def test_the_log_path_records_what_the_in_path_one_records_on_the_same_requests():
    from epp.harness.localstack import LocalStack

    collector = Collector()
    server = grpc.aio.server()
    als_pb2_grpc.add_AccessLogServiceServicer_to_server(collector, server)
    als_port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    stack = LocalStack(n_sims=1, sim_args=SIM_ARGS, response_path="on")
    await asyncio.to_thread(stack.start)
    try:
        assert stack.envoy is not None and stack.pg is not None
        options = EnvoyOptions.loopback(
            stack.envoy.options.epp_grpc_port,
            stack.envoy.options.epp_health_port,
            response_headers=True,
            response_body_mode="FULL_DUPLEX_STREAMED",
            response_log=False,
        )
        envoy = await astart_envoy(
            stack.pg, options, config=both_paths_config(options, als_port), name="envoy-both"
        )
        async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
            for path, body in REQUESTS:
                before = {k: metric(stack, s) for k, s in SERIES.items()}
                async with session.post(envoy.url + path, json={"model": "tiny", **body}) as r:
                    assert r.status == 200
                    await r.read()
                entry = await asyncio.wait_for(collector.entries.get(), 30)
                await wait_inflight_zero(stack)
                inpath = {k: metric(stack, s) - before[k] for k, s in SERIES.items()}
                entry.request.request_headers[ROUTE_ID] = "test"  # the in-path EPP sets none
                logged = read_entry(entry)
                assert logged is not None and logged.complete and logged.status == 200
                meter = logged_meter(logged, routed_at=0.0)
                assert meter.usage is None or meter.usage.prompt_tokens == inpath["isl"], body
                assert meter.output_tokens == inpath["osl"], body
                cached = meter.usage.cached_tokens if meter.usage else 0
                assert cached == inpath["cached"], body
                assert meter.first_token_at is not None
                ttft_ms, inpath_ms = meter.first_token_at * 1000, inpath["ttft"] * 1000
                late = inpath_ms - ttft_ms  # the in-path clock stops later (module doc)
                assert -TTFT_EARLY_MS <= late <= max(TTFT_LATE_MS, 0.25 * inpath_ms), (
                    body,
                    ttft_ms,
                    inpath_ms,
                )
                tpot = meter.itl_s()
                if inpath["tpot_n"]:
                    assert abs(tpot - inpath["tpot"]) <= max(0.1 * inpath["tpot"], 0.001), (
                        body,
                        tpot,
                        inpath["tpot"],
                    )
                else:
                    assert math.isnan(tpot), body
    finally:
        await asyncio.to_thread(stack.stop)
        await server.stop(None)
