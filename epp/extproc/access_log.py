"""The response path through Envoy's access log (`epp serve --response-path log`, the default).

The response never passes through the EPP. Envoy's Lua filter (`epp.response_meter` in
deploy/envoy/envoy.yaml) reads it per chunk inside Envoy and leaves what
`epp/response.py`'s `ResponseMeter` would have noted as dynamic metadata `epp.response`;
Envoy's gRPC access logger (`envoy.access_loggers.http_grpc`) then sends one entry per
finished request, batched, on a long-lived `envoy.service.accesslog.v3.AccessLogService`
stream to the EPP's ext_proc port. So the EPP's cost is one protobuf entry per request,
whatever the answer's length, and no response byte waits for the EPP.

At routing the request's `ResponseLeg` is parked in a `RouteTable` under the route id the
EPP sets on the upstream request (`x-epp-route-id`, which the access logger is told to
log); the entry claims it and ends it: in-flight given back, the `RequestRecord` built
from the entry (`logged_meter`). Times come from Envoy's clock, mapped onto the EPP's by
taking the moment the EPP's pick reached the Lua filter (its request side) as the routing
instant: TTFT is the Lua filter's first output event minus that; TPOT the first-to-last
output event span over tokens − 1; the duration ends at the last upstream byte received.

What this path cannot do that the in-path one (`--response-path on`) does: give the
prompt's pending-prefill tokens back at the first token. Here they are given back by the
first periodic entry (every 5 s) after it, or by the final entry, whichever comes first.

Never leaking: Envoy logs a request that is still running again every 5 s (the
connection manager's `access_log_flush_interval`: an intermediate entry, which restarts
the leg's timeout), so a leg that hears nothing for `--response-log-timeout` (15 s) has
lost its entries (Envoy restarted, the log stream broken and the entries with it) and is
ended by the table's sweep, counted in `epp_response_log_entries_total{outcome="expired"}`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
from envoy.data.accesslog.v3 import accesslog_pb2 as alpb
from envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc

from epp.extproc.handoff import RouteTable
from epp.headers import ROUTE_ID
from epp.response import ResponseMeter, Usage

log = logging.getLogger("epp.extproc")

# Three of Envoy's periodic entries missed (deploy/envoy/envoy.yaml logs a running request
# every 5 s): the request's entries have stopped coming.
RESPONSE_LOG_TIMEOUT = 15.0

# The Lua filter's dynamic metadata namespace (deploy/envoy/envoy.yaml).
METADATA_NAMESPACE = "epp.response"
# Response flags that mean the response did not reach its end.
_CUT = (
    "upstream_remote_reset",
    "upstream_connection_termination",
    "downstream_connection_termination",
    "downstream_remote_reset",
    "upstream_request_timeout",
    "stream_idle_timeout",
    "duration_timeout",
    "local_reset",
    "upstream_max_stream_duration_reached",
)


@dataclass(frozen=True, slots=True)
class LoggedResponse:
    """One access-log entry, read: what the EPP learns about a finished request.
    Times are seconds after the EPP's pick reached Envoy (≈ the EPP's routing instant)."""

    route_id: str
    status: int
    complete: bool
    streamed: bool
    first_token_s: float | None
    last_token_s: float | None
    ended_s: float
    events: int
    usage: Usage | None
    error_status: int


def _seconds(d: object) -> float | None:
    """A google.protobuf.Duration the entry set, in seconds (None when unset)."""
    seconds, nanos = d.seconds, d.nanos  # type: ignore[attr-defined]
    if not seconds and not nanos:
        return None
    return seconds + nanos / 1e9


def read_entry(entry: alpb.HTTPAccessLogEntry) -> LoggedResponse | None:
    """The entry's response, or None when it is not one the EPP routed (no route id)."""
    route_id = entry.request.request_headers.get(ROUTE_ID)
    if not route_id:
        return None
    common = entry.common_properties
    start_us = common.start_time.seconds * 1_000_000 + common.start_time.nanos // 1000
    namespaces = common.metadata.filter_metadata
    # (a protobuf map inserts the key it is indexed with: look before reading)
    fields = namespaces[METADATA_NAMESPACE].fields if METADATA_NAMESPACE in namespaces else {}
    flags = common.response_flags
    # The origin: when the pick reached the Lua filter; else the first byte sent upstream,
    # else the request's last byte received (never sent upstream).
    routed = fields["routed_us"].string_value if "routed_us" in fields else ""
    if routed.isdigit():
        origin_us = int(routed)
    else:
        sent = _seconds(common.time_to_first_upstream_tx_byte)
        origin_us = start_us + (sent or _seconds(common.time_to_last_rx_byte) or 0.0) * 1e6
    ended = _seconds(common.time_to_last_upstream_rx_byte)
    if ended is None:
        ended = _seconds(common.time_to_last_downstream_tx_byte) or _seconds(common.duration)

    def at(key: str) -> float | None:
        value = fields[key].string_value if key in fields else ""
        return (int(value) - origin_us) / 1e6 if value.isdigit() else None

    usage = None
    if "usage" in fields:
        try:
            usage = Usage.from_json(json.loads(fields["usage"].string_value))
        except ValueError:
            usage = None
    error = fields["error"].string_value if "error" in fields else ""
    status = entry.response.response_code.value
    return LoggedResponse(
        route_id=route_id,
        status=status,
        # "streamed" is set once the Lua filter has read the response to its end
        complete=not any(getattr(flags, f) for f in _CUT) and "streamed" in fields,
        streamed=fields["streamed"].bool_value if "streamed" in fields else False,
        first_token_s=at("first_us"),
        last_token_s=at("last_us"),
        ended_s=max(start_us + (ended or 0.0) * 1e6 - origin_us, 0.0) / 1e6,
        events=int(fields["events"].number_value) if "events" in fields else 0,
        usage=usage,
        error_status=_error_status(error),
    )


def _error_status(code: str) -> int:
    if not code.isdigit():
        return 0
    value = int(code)
    return value if 400 <= value <= 599 else 500


def logged_meter(resp: LoggedResponse, routed_at: float) -> ResponseMeter:
    """A `ResponseMeter` holding what the entry says, on the EPP's clock (`routed_at` =
    the routing instant), so the record is built exactly as the in-path one is."""
    meter = ResponseMeter(resp.streamed)
    if resp.first_token_s is not None:
        meter.first_token_at = routed_at + max(resp.first_token_s, 0.0)
        last = resp.last_token_s if resp.last_token_s is not None else resp.first_token_s
        meter.last_token_at = routed_at + max(last, 0.0)
    meter.token_events = resp.events
    meter.usage = resp.usage
    meter.error_status = resp.error_status
    return meter


class AccessLogServicer(als_pb2_grpc.AccessLogServiceServicer):
    """Envoy's access-log streams: each entry ends the leg it names (see the module doc).
    Entries for other replicas' or unknown route ids are counted by the table and dropped
    (with one access logger per EPP replica, as deploy/envoy/envoy-replicas.yaml has it,
    every EPP sees every entry and keeps its own)."""

    def __init__(self, routes: RouteTable) -> None:
        self.routes = routes
        self.entries = 0

    async def StreamAccessLogs(
        self,
        request_iterator: AsyncIterator[als_pb2.StreamAccessLogsMessage],
        context: grpc.aio.ServicerContext,
    ) -> als_pb2.StreamAccessLogsResponse:
        async for msg in request_iterator:
            for entry in msg.http_logs.log_entry:
                self.take(entry)
        return als_pb2.StreamAccessLogsResponse()

    def take(self, entry: alpb.HTTPAccessLogEntry) -> None:
        self.entries += 1
        try:
            resp = read_entry(entry)
        except Exception:  # a malformed entry costs its measurement, never the stream
            log.exception("reading an access-log entry failed; skipped")
            return
        if resp is None:
            return
        if entry.common_properties.intermediate_log_entry:  # still running
            running = self.routes.touch(resp.route_id)
            if running is not None and resp.first_token_s is not None:
                # past its first token: the prompt no longer waits for prefill
                running.director.first_token(running.decision)
            return
        leg = self.routes.claim(resp.route_id)
        if leg is None:
            return
        meter = logged_meter(resp, leg.routed_at)
        leg.end_logged(meter, resp.status, resp.complete, leg.routed_at + resp.ended_s)


def route_table(observer: bool, log: bool, log_timeout: float) -> RouteTable | None:
    """The table of parked legs for `--response-path observer` / `log`; None when the
    response comes on the routing stream itself (`on`, `off`)."""
    if observer:
        return RouteTable()
    return RouteTable(log_timeout, claimant="log") if log else None
