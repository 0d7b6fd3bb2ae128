"""Every refusal the EPP answers is logged once with its reason and request id, at most
N lines per second per status (clock injected: no timing)."""

import logging

from epp.errors import EppError, internal_error, not_found, unavailable
from epp.extproc.refusals import MAX_FIELD_CHARS, RefusalLog
from epp.extproc.stream import RequestStream
from tests.unit.test_stream import BASE_HEADERS, body_msg, headers_msg, make_director

LOGGER = "epp.test.refusals"


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_at_most_n_lines_per_second_per_status_then_the_suppressed_count(caplog):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    clock = Clock()
    refusals = RefusalLog(logging.getLogger(LOGGER), per_second=2, clock=clock)
    written = [refusals.record(f"r{i}", unavailable("pool empty")) for i in range(5)]
    assert written == [True, True, False, False, False]  # 2 logged, 3 suppressed
    assert refusals.record("r5", not_found("no such model"))  # another status: its own budget
    clock.now += 0.999  # still the same one-second window
    assert not refusals.record("r6", unavailable("pool empty"))
    clock.now += 0.001  # a new window: logged, with the 4 suppressed before (r2, r3, r4, r6)
    assert refusals.record("r7", unavailable("pool empty"))
    assert lines(caplog) == [
        "request r0 answered 503: pool empty",
        "request r1 answered 503: pool empty",
        "request r5 answered 404: no such model",
        "request r7 answered 503: pool empty (4 more 503s suppressed in the second before)",
    ]
    levels = [r.levelno for r in caplog.records if r.name == LOGGER]
    assert levels == [logging.ERROR, logging.ERROR, logging.WARNING, logging.ERROR]


def test_a_500_carries_the_traceback_of_its_cause(caplog):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    refusals = RefusalLog(logging.getLogger(LOGGER), clock=Clock())
    error = internal_error("plugin x failed: KeyError")
    try:
        raise KeyError("boom")
    except KeyError as e:
        error.__cause__ = e
    refusals.record("r1", error)
    (record,) = [r for r in caplog.records if r.name == LOGGER]
    assert record.exc_info is not None and record.exc_info[0] is KeyError


def test_client_text_is_clipped_and_escaped(caplog):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    refusals = RefusalLog(logging.getLogger(LOGGER), clock=Clock())
    refusals.record("id\twith\ttabs", EppError(400, "model 'x" + "y" * 1000 + "'"))
    (line,) = lines(caplog)
    assert line.startswith("request id\\twith\\ttabs answered 400: model 'xyyy")
    # 300 characters of the reason, then an ellipsis: "model 'x" (8) + 292 y's
    assert line.endswith("y" * (MAX_FIELD_CHARS - 8) + "…")


def test_a_refused_stream_logs_its_request_id_and_reason(caplog):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    director, _ = make_director(models=["m"])
    refusals = RefusalLog(logging.getLogger(LOGGER), clock=Clock())
    stream = RequestStream(director, 1 << 20, refusals=refusals)
    stream.handle(headers_msg(BASE_HEADERS))
    (resp,) = stream.handle(body_msg(b'{"model": "unknown", "prompt": "x"}', True))
    assert resp.immediate_response.status.code == 404
    assert lines(caplog) == [
        "request rid-7 answered 404: model 'unknown' is not served by this pool; served models: m"
    ]
