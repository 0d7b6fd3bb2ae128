"""`RequestStream.needs_async`: the servicer skips `handle_async` (and its coroutine) for a
message only when `handle_async` would do nothing but call `handle` (issue 13 §6)."""

from __future__ import annotations

import pytest

from epp.director import ColdStart
from epp.extproc.stream import PARSE_OFF_LOOP_BYTES, Phase, RequestStream
from tests.unit.test_stream import BASE_HEADERS, BODY, body_msg, headers_msg, make_director

BIG = b'{"model": "m", "prompt": "' + b"x" * PARSE_OFF_LOOP_BYTES + b'"}'


def _gathering(director) -> RequestStream:
    stream = RequestStream(director, 32 << 20)
    assert stream.handle(headers_msg(BASE_HEADERS)) == []
    assert stream.phase is Phase.GATHER_BODY
    return stream


@pytest.mark.parametrize(
    ("chunks", "last", "want"),
    [
        ([], body_msg(BODY, eos=True), False),  # a small body: parsed on the loop
        ([], body_msg(BIG, eos=True), True),  # a large one: the worker thread
        ([BIG[:100]], body_msg(BIG[100:], eos=True), True),  # large only with its chunks
        ([], body_msg(BIG, eos=False), False),  # not the end: nothing to parse yet
    ],
)
def test_only_a_completing_large_body_needs_the_coroutine(chunks, last, want):
    director, _ = make_director()
    stream = _gathering(director)
    for chunk in chunks:
        assert stream.handle(body_msg(chunk, eos=False)) == []
    assert stream.needs_async(last) is want
    # What handle_async would hand to the worker thread: a body exactly when needed.
    assert (stream._final_body(last, PARSE_OFF_LOOP_BYTES) is not None) is want


def test_headers_and_routed_streams_never_need_it():
    director, _ = make_director()
    stream = RequestStream(director, 32 << 20)
    first = headers_msg(BASE_HEADERS)
    assert not stream.needs_async(first)
    stream.handle(first)
    stream.handle(body_msg(BODY, eos=True))
    assert stream.phase is Phase.ROUTED
    assert not stream.needs_async(body_msg(BIG, eos=True))


def test_scale_from_zero_or_flow_control_always_take_handle_async():
    director, _ = make_director()
    director.cold_start = ColdStart(wake=lambda: None)
    assert RequestStream(director, 32 << 20).needs_async(headers_msg(BASE_HEADERS))
    director, _ = make_director()
    director.flow_control = object()  # type: ignore[assignment]  # only its presence counts
    assert _gathering(director).needs_async(body_msg(BODY, eos=True))
