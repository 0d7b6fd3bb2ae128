"""The response meter on real response shapes: vLLM/OpenAI SSE (chat and completions),
`epp sim`'s spaced JSON, split lines, usage, errors, and plain JSON bodies."""

import json
import math

import pytest

from epp.response import ResponseMeter, Usage


def sse(obj) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


def chat(content, **extra):
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": content}], **extra}


USAGE = {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15,
         "prompt_tokens_details": {"cached_tokens": 8}}  # fmt: skip


def test_chat_stream_first_token_itl_and_usage_from_the_last_event():
    m = ResponseMeter(streamed=True)
    # vLLM's first chat event carries only the role (empty content): no token yet.
    assert m.feed(sse(chat({"role": "assistant", "content": ""})), 1.0) is False
    assert m.first_token_at is None
    assert m.feed(sse(chat({"content": "Hel"})), 1.5) is True  # the first token
    assert m.feed(sse(chat({"content": "lo"})), 1.7) is False
    assert m.feed(sse(chat({"content": "!"}, finish_reason="stop")), 2.1) is False
    m.feed(sse({"choices": [], "usage": USAGE}) + sse(b"[DONE]"), 2.2)
    assert m.finish(2.3) is False
    assert (m.first_token_at, m.last_token_at, m.token_events) == (1.5, 2.1, 3)
    assert m.usage == Usage(12, 3, 8)
    # (2.1 − 1.5) / (3 − 1) = 0.3 s between tokens
    assert m.itl_s() == pytest.approx(0.3)
    assert m.output_tokens == 3 and m.error_status == 0


def test_completions_stream_with_compact_json_and_lines_split_across_chunks():
    m = ResponseMeter(streamed=True)
    raw = b'data: {"choices":[{"index":0,"text":"a","logprobs":null}]}\n\n'
    assert m.feed(raw[:20], 1.0) is False  # half a line: nothing decided yet
    assert m.feed(raw[20:], 1.1) is True
    two = b'data: {"choices":[{"text":"b"}]}\n\ndata: {"choices":[{"text":"c"}]}\n\n'
    m.feed(two, 1.4)  # two events in one chunk: both count, one chunk time
    m.finish(1.5)
    assert m.token_events == 3 and m.usage is None
    # no usage: (1.4 − 1.1) / (3 events − 1)
    assert m.itl_s() == pytest.approx(0.15)


def test_spaced_json_as_epp_sim_writes_it_and_escaped_quotes_in_text():
    m = ResponseMeter(streamed=True)
    assert m.feed(b'data: {"choices": [{"index": 0, "text": "x"}]}\n\n', 2.0) is True
    # A token whose text itself contains \"text\": \" must count once, as a token.
    m.feed(sse({"choices": [{"text": 'say "text": "'}]}), 2.5)
    assert m.token_events == 2


def test_usage_with_continuous_stats_keeps_the_last():
    m = ResponseMeter(streamed=True)
    m.feed(sse(chat({"content": "a"}, usage={**USAGE, "completion_tokens": 1})), 1.0)
    m.feed(sse(chat({"content": "b"}, usage={**USAGE, "completion_tokens": 2})), 1.2)
    m.finish(1.3)
    assert m.usage == Usage(12, 2, 8) and m.token_events == 2


def test_error_event_mid_stream_marks_the_response_failed():
    m = ResponseMeter(streamed=True)
    m.feed(sse(chat({"content": "a"})), 1.0)
    m.feed(sse({"error": {"message": "engine died", "code": 503}}) + sse(b"[DONE]"), 1.1)
    m.finish(1.2)
    assert m.error_status == 503 and m.token_events == 1


def test_no_token_at_all_leaves_ttft_and_itl_unset():
    m = ResponseMeter(streamed=True)
    m.feed(b": keep-alive comment\n\n" + sse(b"[DONE]"), 1.0)
    m.finish(1.1)
    assert m.first_token_at is None and math.isnan(m.itl_s()) and m.output_tokens == 0


def test_json_body_usage_and_first_token_at_its_end():
    body = json.dumps({"choices": [{"text": "hi there"}], "usage": USAGE}).encode()
    m = ResponseMeter(streamed=False)
    assert m.feed(body[:10], 1.0) is False
    assert m.feed(body[10:], 1.2) is False
    assert m.finish(1.3) is True
    assert m.first_token_at == 1.3 and m.usage == Usage(12, 3, 8)
    assert math.isnan(m.itl_s())  # nothing streamed: no gap between tokens was observed


def test_json_error_body_and_oversized_body_are_handled():
    m = ResponseMeter(streamed=False)
    m.feed(json.dumps({"error": {"message": "no", "code": 400}}).encode(), 1.0)
    m.finish(1.0)
    assert m.error_status == 400
    old_vllm = ResponseMeter(streamed=False)
    old_vllm.feed(json.dumps({"object": "error", "message": "no", "code": 404}).encode(), 1.0)
    old_vllm.finish(1.0)
    assert old_vllm.error_status == 404


def test_large_json_body_keeps_only_its_tail_and_still_finds_usage():
    # An embeddings-sized body: 200,000 floats, usage last, as OpenAI servers write it.
    body = json.dumps({"data": [{"embedding": [0.125] * 200_000}], "usage": USAGE}).encode()
    m = ResponseMeter(streamed=False)
    for i in range(0, len(body), 65_536):
        m.feed(body[i : i + 65_536], 1.0)
        assert sum(map(len, m._body)) <= 65_536 + 4096  # bounded: never the whole body
    assert m.finish(2.0) is True
    assert m.usage == Usage(12, 3, 8) and m.first_token_at == 2.0
    no_usage = ResponseMeter(streamed=False, max_json_bytes=10)
    no_usage.feed(json.dumps({"choices": [{"text": "x" * 100}]}).encode(), 1.0)
    no_usage.finish(1.0)
    assert no_usage.usage is None and no_usage.first_token_at == 1.0


# ---- Anthropic's Messages API (bytes as vLLM 0.32 sent them on the tiny model) --------
MESSAGES_STREAM = (
    b'event: message_start\ndata: {"type":"message_start","message":'
    b'{"id":"chatcmpl-a748ab7c443095b0",'
    b'"type":"message","role":"assistant","content":[],"model":"tiny","stop_reason":null,'
    b'"stop_sequence":null,"usage":{"input_tokens":39,"output_tokens":0}}}\n\n'
    b'event: content_block_start\ndata: {"type":"content_block_start","content_block":'
    b'{"type":"text","text":""},"index":0}\n\n'
    b'event: content_block_delta\ndata: {"type":"content_block_delta","delta":'
    b'{"type":"text_delta","text":" gener"},"index":0}\n\n'
    b'event: content_block_delta\ndata: {"type":"content_block_delta","delta":'
    b'{"type":"text_delta","text":""},"index":0}\n\n'
    b'event: content_block_delta\ndata: {"type":"content_block_delta","delta":'
    b'{"type":"text_delta","text":"================"},"index":0}\n\n'
    b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
    b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"max_tokens",'
    b'"stop_sequence":null},"usage":{"input_tokens":7,"output_tokens":3,'
    b'"cache_creation_input_tokens":0,"cache_read_input_tokens":32}}\n\n'
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
)
MESSAGES_BODY = (
    b'{"id":"chatcmpl-9d78aae75ea77654","type":"message","role":"assistant","content":'
    b'[{"type":"text","text":" structuresxed Set"}],"model":"tiny","stop_reason":"max_tokens",'
    b'"usage":{"input_tokens":7,"output_tokens":3,"cache_creation_input_tokens":0,'
    b'"cache_read_input_tokens":32}}'
)


def test_messages_stream_first_token_itl_and_anthropic_usage():
    m = ResponseMeter(streamed=True)
    events = MESSAGES_STREAM.split(b"\n\n")
    # message_start and content_block_start carry no output; the first text delta does
    assert m.feed(events[0] + b"\n\n", 1.0) is False
    assert m.feed(events[1] + b"\n\n", 1.1) is False
    assert m.feed(events[2] + b"\n\n", 1.5) is True
    m.feed(events[3] + b"\n\n", 1.6)  # an empty delta (a token that decoded to nothing)
    m.feed(events[4] + b"\n\n", 2.1)
    m.feed(b"\n\n".join(events[5:]), 2.2)  # stop, message_delta (usage), message_stop
    m.finish(2.3)
    assert (m.first_token_at, m.last_token_at, m.token_events) == (1.5, 2.1, 2)
    # prompt = input_tokens + cache reads + cache writes; cached = the reads
    assert m.usage == Usage(39, 3, 32)
    assert m.itl_s() == pytest.approx(0.3)  # (2.1 − 1.5) / (3 − 1)
    assert m.error_status == 0


def test_messages_stream_split_anywhere_reads_the_same():
    for cut in range(1, len(MESSAGES_STREAM), 37):
        m = ResponseMeter(streamed=True)
        m.feed(MESSAGES_STREAM[:cut], 1.0)
        m.feed(MESSAGES_STREAM[cut:], 2.0)
        m.finish(3.0)
        assert m.usage == Usage(39, 3, 32) and m.token_events == 2


def test_messages_body_usage_and_errors():
    m = ResponseMeter(streamed=False)
    m.feed(MESSAGES_BODY, 1.0)
    assert m.finish(2.0) is True
    assert m.usage == Usage(39, 3, 32) and m.error_status == 0
    err = b'{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}'
    m = ResponseMeter(streamed=False)
    m.feed(err, 1.0)
    m.finish(2.0)
    assert m.error_status == 429
    m = ResponseMeter(streamed=False)
    m.feed(b'{"type":"error","error":{"type":["odd"],"message":"x"}}', 1.0)
    m.finish(2.0)
    assert m.error_status == 500  # an unknown error type is a 500, never a crash
    m = ResponseMeter(streamed=True)
    m.feed(
        b'event: error\ndata: {"type":"error","error":{"type":"internal_error","message":"x"}}\n\n',
        1.0,
    )
    m.finish(2.0)
    assert m.error_status == 500
    tool = (
        b'data: {"type":"content_block_delta","delta":'
        b'{"type":"input_json_delta","partial_json":"{\\"a"}}\n\n'
    )
    m = ResponseMeter(streamed=True)
    assert m.feed(tool, 1.0) is True  # tool input counts as output
    think = (
        b'data: {"type":"content_block_delta","delta":'
        b'{"type":"thinking_delta","thinking":"hm"}}\n\n'
    )
    m = ResponseMeter(streamed=True)
    assert m.feed(think, 1.0) is True
