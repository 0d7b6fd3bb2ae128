"""The access-log response path (`--response-path log`) on exact protobufs: the routing
stream parks the request's leg under its route id; Envoy's access-log entry (what its Lua
filter and timings say) claims it, releases the in-flight counts once and gives the same
`RequestRecord` the in-path stream builds; entries that are not ours are counted and
dropped; a leg whose entry never comes is given back by the sweep after the timeout."""

import json
import math

from envoy.data.accesslog.v3 import accesslog_pb2 as alpb

from epp.extproc.access_log import (
    METADATA_NAMESPACE,
    AccessLogServicer,
    logged_meter,
    read_entry,
    route_table,
)
from epp.extproc.handoff import RouteTable
from epp.headers import ROUTE_ID
from tests.unit.test_observer_stream import route, setup
from tests.unit.test_stream_response import (
    OUTPUT_TOKENS,
    PROMPT_TOKENS,
    USAGE,
    event,
    response_body,
    response_headers,
    token,
)

START_US = 1_700_000_000_000_000  # Envoy's start_time of the request, µs since the epoch


def entry(
    route_id: str | None = "r.1",
    status: int = 200,
    routed_ms: float = 2.0,  # after the request started: when the pick reached Envoy
    first_ms: float | None = 252.0,
    last_ms: float | None = 452.0,
    ended_ms: float = 453.0,
    events: int = 3,
    usage: dict | None = USAGE,
    streamed: bool = True,
    error: str | None = None,
    lua: bool = True,
    **flags: bool,
) -> alpb.HTTPAccessLogEntry:
    e = alpb.HTTPAccessLogEntry()
    if route_id is not None:
        e.request.request_headers[ROUTE_ID] = route_id
    e.response.response_code.value = status
    c = e.common_properties
    c.start_time.seconds, c.start_time.nanos = divmod(START_US, 1_000_000)
    c.start_time.nanos *= 1000
    c.time_to_first_upstream_tx_byte.nanos = 3_000_000
    c.time_to_last_upstream_rx_byte.FromMilliseconds(int(ended_ms))
    for name, value in flags.items():
        setattr(c.response_flags, name, value)
    if not lua:
        return e

    def us(ms: float) -> str:
        return str(START_US + int(ms * 1000))

    md = {"routed_us": us(routed_ms), "streamed": streamed, "events": events}
    if first_ms is not None:
        md |= {"first_us": us(first_ms), "last_us": us(last_ms or first_ms)}
    if usage is not None:
        md["usage"] = json.dumps(usage)
    if error is not None:
        md["error"] = error
    c.metadata.filter_metadata[METADATA_NAMESPACE].update(md)
    return e


def test_an_entry_reads_as_times_after_the_pick_and_the_tokens():
    got = read_entry(entry())
    assert got is not None and got.route_id == "r.1" and got.status == 200 and got.complete
    assert math.isclose(got.first_token_s, 0.250) and math.isclose(got.last_token_s, 0.450)
    assert math.isclose(got.ended_s, 0.451)
    assert got.usage is not None and (got.usage.prompt_tokens, got.usage.cached_tokens) == (90, 64)
    meter = logged_meter(got, routed_at=100.0)
    assert math.isclose(meter.first_token_at, 100.25) and math.isclose(meter.itl_s(), 0.1)
    assert meter.output_tokens == 3


def test_without_usage_the_output_events_count_and_an_error_code_is_kept():
    got = read_entry(entry(usage=None, events=7, error="503"))
    assert got is not None and got.usage is None and got.error_status == 503
    assert logged_meter(got, 0.0).output_tokens == 7


def test_a_cut_response_or_one_the_lua_filter_never_finished_is_incomplete():
    assert read_entry(entry(upstream_remote_reset=True)).complete is False
    assert read_entry(entry(downstream_remote_reset=True)).complete is False
    cut = read_entry(entry(lua=False))
    assert cut is not None and cut.complete is False and cut.first_token_s is None
    # the request side ran (routed_us), the response side never reached its end
    half = entry(lua=False)
    half.common_properties.metadata.filter_metadata[METADATA_NAMESPACE].update({"routed_us": "1"})
    assert read_entry(half).complete is False


def test_an_entry_without_a_route_id_is_not_ours():
    assert read_entry(entry(route_id=None)) is None


def test_the_entry_ends_the_parked_leg_once_with_the_in_path_record():
    ds, director, observer, clock, _, records = setup()
    routes = RouteTable(60.0, clock, claimant="log")
    s, _ = route(director, observer, clock, routes)
    s.close()  # Envoy ends the routing stream at once: the response does not come here
    assert ds.inflight("e0") == (1, PROMPT_TOKENS + OUTPUT_TOKENS) and records == []
    servicer = AccessLogServicer(routes)
    servicer.take(entry(route_id=f"{routes.nonce}.1"))
    assert ds.inflight("e0") == (0, 0) and len(routes) == 0
    (rec,) = records
    # TTFT 252 − 2 ms = 250 ms after the pick; TPOT (452 − 252) / (3 − 1) = 100 ms.
    assert math.isclose(rec.ttft_ms, 250.0) and math.isclose(rec.itl_ms, 100.0)
    assert (rec.isl, rec.osl, rec.cached_tokens, rec.ok, rec.status) == (90, 3, 64, True, 200)
    assert math.isclose(rec.duration_s, 0.451)  # to the last upstream byte, not the log's arrival
    servicer.take(entry(route_id=f"{routes.nonce}.1"))  # a duplicate: unknown, nothing twice
    assert routes.unknown == 1 and len(records) == 1 and ds.inflight("e0") == (0, 0)


def test_other_replicas_and_malformed_entries_are_counted_and_dropped():
    ds, director, observer, clock, _, records = setup()
    routes = RouteTable(60.0, clock, claimant="log")
    route(director, observer, clock, routes)
    servicer = AccessLogServicer(routes)
    servicer.take(entry(route_id="someoneelse.1"))
    bad = entry(route_id=f"{routes.nonce}.1")
    bad.common_properties.metadata.filter_metadata[METADATA_NAMESPACE].update({"usage": "{"})
    servicer.take(bad)  # unreadable usage: measured without it, still released
    assert routes.foreign == 1 and ds.inflight("e0") == (0, 0)
    assert records[0].osl == 3  # the output events counted instead


def test_a_leg_whose_entry_never_comes_is_given_back_after_the_timeout():
    ds, director, observer, clock, _, records = setup()
    routes = RouteTable(60.0, clock, claimant="log")
    route(director, observer, clock, routes)
    clock.now += 59.0
    assert routes.sweep() is not None and ds.inflight("e0")[0] == 1
    clock.now += 2.0
    assert routes.sweep() is None and routes.expired == 1
    assert ds.inflight("e0") == (0, 0) and records[0].ok is False


def test_the_table_per_mode():
    assert route_table(observer=False, log=False, log_timeout=5) is None
    assert route_table(observer=True, log=False, log_timeout=5).claimant == "observer"
    assert route_table(observer=True, log=True, log_timeout=5).claimant == "observer"
    table = route_table(observer=False, log=True, log_timeout=5)
    assert table.claimant == "log" and table.join_timeout == 5


def test_a_response_envoy_sends_to_the_routing_stream_is_measured_there():
    """An Envoy (or a gateway) that sends the response phases to the routing filter while
    the EPP runs `--response-path log`: measured in-path, never held until the timeout."""
    ds, director, observer, clock, _, records = setup()
    routes = RouteTable(60.0, clock, claimant="log")
    s, _ = route(director, observer, clock, routes)
    s.handle(response_headers())
    assert len(routes) == 0  # taken back from the table
    clock.now += 0.25
    s.handle(response_body(token("a"), False))
    last = token("b") + token("c") + event({"choices": [], "usage": USAGE}) + event(b"[DONE]")
    s.handle(response_body(last, True))
    assert ds.inflight("e0") == (0, 0) and records[0].osl == 3
    AccessLogServicer(routes).take(entry(route_id=f"{routes.nonce}.1"))  # then its entry
    assert routes.unknown == 1 and len(records) == 1 and routes.claimed == 0


def test_a_periodic_entry_keeps_a_long_request_and_only_silence_expires_it():
    ds, director, observer, clock, _, records = setup()
    routes = RouteTable(15.0, clock, claimant="log")
    route(director, observer, clock, routes)
    servicer = AccessLogServicer(routes)
    still = entry(route_id=f"{routes.nonce}.1", lua=False)
    still.common_properties.intermediate_log_entry = True
    for _ in range(4):  # a 40 s response, logged as running every 10 s
        clock.now += 10.0
        servicer.take(still)
        assert routes.sweep() is not None and ds.inflight("e0")[0] == 1
    assert routes.claimed == 0 and records == []  # "still running" is not the end
    assert ds.inflight("e0") == (1, PROMPT_TOKENS + OUTPUT_TOKENS)  # no first token yet
    running = entry(route_id=f"{routes.nonce}.1", first_ms=300.0, last_ms=300.0)
    running.common_properties.intermediate_log_entry = True
    servicer.take(running)  # past its first token: the prompt leaves pending prefill
    assert ds.inflight("e0") == (1, OUTPUT_TOKENS) and records == []
    servicer.take(entry(route_id=f"{routes.nonce}.1"))
    assert ds.inflight("e0") == (0, 0) and routes.claimed == 1 and records[0].ok
    route(director, observer, clock, routes)  # a second one whose entries stop
    clock.now += 16.0
    assert routes.sweep() is None and routes.expired == 1 and ds.inflight("e0") == (0, 0)
