"""Fuzzing the ext_proc state machine with hypothesis (issue 13 §2).

Every stream, whatever Envoy (or something pretending to be Envoy) sends on it, must
get well-formed ProcessingResponses or one clean ImmediateResponse (a 4xx, or 503/408
with an OpenAI-style JSON body; never a 500, which would mean a bug reached the
catch-all), must never raise, and must hold nothing (in-flight counts, body budget)
once closed.

`make test` runs FUZZ_EXAMPLES (200) derandomized examples per property (1,400 streams),
so it is not flaky; `make fuzz` runs EPP_FUZZ_EXAMPLES with fresh randomness and prints
the number of streams driven (docs/RELIABILITY.md).
"""

from __future__ import annotations

import atexit
import json
import os
import random
from pathlib import Path

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epp.composition import install_plugins
from epp.config.loader import load_config_file
from epp.datastore import Datastore, Endpoint
from epp.director import Director
from epp.extproc.stream import RequestStream
from epp.headers import DESTINATION_ENDPOINT, MODEL_REWRITE, PREFILLER_HOST_PORT, REQUEST_ID
from epp.limits import BodyBudget, BodyLimits, HeaderLimits
from epp.scheduling.registry import Handle

FUZZ_EXAMPLES = int(os.environ.get("EPP_FUZZ_EXAMPLES", "200"))
LONG_RUN = "EPP_FUZZ_EXAMPLES" in os.environ
FUZZ = settings(
    max_examples=FUZZ_EXAMPLES,
    derandomize=not LONG_RUN,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
MODES = processing_mode_pb2.ProcessingMode
PATHS = ["/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/responses", "/x"]
CONFIG = Path(__file__).parents[2] / "config" / "prefix-aware.yaml"
STREAMS = {"n": 0, "failed": 0}
# `make fuzz` writes the running count here every 1,000 streams (a long run's progress).
PROGRESS = os.environ.get("EPP_FUZZ_PROGRESS")

if LONG_RUN:
    atexit.register(
        lambda: print(f"\nfuzz: {STREAMS['n']} streams driven, {STREAMS['failed']} failed")
    )


def pool() -> tuple[Director, Datastore]:
    """Two endpoints serving "m"; the prefix-aware config, so prefix hashing runs too."""
    ds = Datastore(require_metrics=False)
    ds.set_endpoints([Endpoint(f"e{i}", f"10.0.0.{i + 1}", 8000) for i in range(2)])
    for e in ds.endpoints():
        ds.set_models(e.name, ["m", "lora"])
    cfg = load_config_file(CONFIG, Handle(rng=random.Random(0)), install_plugins())
    return Director(ds, cfg.scheduler, cfg.pre_request, random.Random(0)), ds


DIRECTOR, DATASTORE = pool()
LIMITS = BodyLimits(max_json_depth=64, max_messages=1000, max_prompt_tokens=100_000)


# ---- request bodies ------------------------------------------------------------------

json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
)
json_value = st.recursive(
    json_leaf,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
token_ids = st.lists(st.integers(min_value=-(2**40), max_value=2**70), max_size=300)
content_part = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=60)}),
    st.fixed_dictionaries({"type": st.just("image_url"), "image_url": json_value}),
    json_value,
)
message = st.one_of(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "system", "assistant", "tool", ""]),
            "content": st.one_of(
                st.text(max_size=200), st.lists(content_part, max_size=5), json_value
            ),
        }
    ),
    json_value,
)
well_shaped = st.fixed_dictionaries(
    {"model": st.sampled_from(["m", "lora", "unknown", "", "x" * 300])},
    optional={
        "prompt": st.one_of(
            st.text(max_size=400),
            st.lists(st.text(max_size=20), max_size=5),
            token_ids,
            st.lists(token_ids, max_size=3),
            json_value,
        ),
        "messages": st.one_of(st.lists(message, max_size=8), json_value),
        "input": json_value,
        "max_tokens": st.one_of(st.integers(min_value=-5, max_value=2**70), json_value),
        "stream": json_value,
        "cache_salt": json_value,
    },
)


def dump(obj: object) -> bytes:
    return json.dumps(obj, ensure_ascii=False, allow_nan=True).encode("utf-8", "surrogatepass")


special_bodies = st.one_of(
    st.integers(1, 5000).map(lambda n: b'{"model": "m", "prompt": ' + b"[" * n + b"]" * n + b"}"),
    st.integers(4000, 6000).map(
        lambda n: b'{"model": "m", "prompt": "x", "max_tokens": ' + b"9" * n + b"}"
    ),
    st.sampled_from([r"\ud800", r"\udfff", r"a\udc00", r"\ud83d\ude00"]).map(
        lambda e: b'{"model": "m", "prompt": "' + e.encode() + b'"}'
    ),
    st.binary(max_size=200),  # invalid UTF-8, anything
    st.just(b'{"model": "m", "model": "lora", "prompt": NaN, "max_tokens": Infinity}'),
    st.integers(900, 1100).map(
        lambda n: dump({"model": "m", "messages": [{"role": "user", "content": "hi"}] * n})
    ),
    st.integers(0, 2).map(lambda k: dump({"model": "m", "prompt": "y" * (100_000 * 4 + k)})),
)
bodies = st.one_of(well_shaped.map(dump), special_bodies)


# ---- ext_proc messages -----------------------------------------------------------------


def headers(path: str, extra: int, rid: bytes, eos: bool, mode: int, rewrite: str | None):
    hv = [
        base_pb2.HeaderValue(key=":path", raw_value=path.encode()),
        base_pb2.HeaderValue(key=":method", raw_value=b"GET" if eos else b"POST"),
        base_pb2.HeaderValue(key=REQUEST_ID, raw_value=rid),
        base_pb2.HeaderValue(key=DESTINATION_ENDPOINT, raw_value=b"6.6.6.6:1"),
        base_pb2.HeaderValue(key=PREFILLER_HOST_PORT, raw_value=b"6.6.6.6:2"),
    ]
    if rewrite is not None:
        hv.append(base_pb2.HeaderValue(key=MODEL_REWRITE, raw_value=rewrite.encode()))
    hv += [base_pb2.HeaderValue(key=f"x-f{i}", raw_value=b"v" * (i % 7)) for i in range(extra)]
    return pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=hv), end_of_stream=eos),
        protocol_config=pb.ProtocolConfiguration(request_body_mode=mode),
    )


header_msgs = st.builds(
    headers,
    st.sampled_from(PATHS),
    st.one_of(st.integers(0, 5), st.integers(90, 120)),
    st.one_of(st.just(b"rid-1"), st.binary(max_size=200)),
    st.booleans(),
    st.sampled_from([MODES.FULL_DUPLEX_STREAMED, MODES.BUFFERED, MODES.STREAMED, MODES.NONE]),
    st.one_of(st.none(), st.sampled_from(["m", "lora", "unknown", ""])),
)


def body(data: bytes, eos: bool) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=data, end_of_stream=eos))


other_msgs = st.one_of(
    st.builds(body, st.binary(max_size=64), st.booleans()),
    st.just(pb.ProcessingRequest(request_trailers=pb.HttpTrailers())),
    st.just(pb.ProcessingRequest(response_headers=pb.HttpHeaders())),
    st.builds(
        lambda d, e: pb.ProcessingRequest(response_body=pb.HttpBody(body=d, end_of_stream=e)),
        st.binary(max_size=64),
        st.booleans(),
    ),
    st.just(pb.ProcessingRequest(response_trailers=pb.HttpTrailers())),
    st.just(pb.ProcessingRequest()),  # no oneof set at all
)


@st.composite
def split_body(draw: st.DrawFn) -> list[pb.ProcessingRequest]:
    """A body cut at arbitrary points, with or without end_of_stream on the last chunk."""
    data = draw(bodies)
    cuts = sorted(set(draw(st.lists(st.integers(0, len(data)), max_size=6))))
    parts = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    eos = draw(st.booleans())
    return [body(p, eos and i == len(parts) - 1) for i, p in enumerate(parts)]


@st.composite
def sequences(draw: st.DrawFn) -> list[pb.ProcessingRequest]:
    """Mostly plausible streams (headers, a split body, response phases), then shuffled,
    duplicated or truncated parts, and random messages anywhere."""
    msgs = [draw(header_msgs), *draw(split_body())]
    if draw(st.booleans()):
        msgs.append(pb.ProcessingRequest(request_trailers=pb.HttpTrailers()))
    msgs += draw(st.lists(other_msgs, max_size=4))
    how = draw(st.sampled_from(["as is", "shuffle", "duplicate", "truncate", "insert"]))
    if how == "shuffle":
        msgs = draw(st.permutations(msgs))
    elif how == "duplicate" and msgs:
        i = draw(st.integers(0, len(msgs) - 1))
        msgs.insert(i, msgs[i])
    elif how == "truncate":
        msgs = msgs[: draw(st.integers(0, len(msgs)))]
    elif how == "insert":
        msgs.insert(draw(st.integers(0, len(msgs))), draw(other_msgs | header_msgs))
    return msgs


# ---- the invariants ----------------------------------------------------------------------


def check_response(resp: object) -> None:
    assert isinstance(resp, pb.ProcessingResponse)
    assert resp.WhichOneof("response") is not None
    resp.SerializeToString()  # a well-formed message
    if resp.HasField("immediate_response"):
        ir = resp.immediate_response
        assert ir.status.code in (400, 404, 408, 413, 431, 503), ir
        err = json.loads(ir.body)["error"]
        assert isinstance(err["message"], str) and err["message"]
        assert err["type"] and err["code"]


def drive(msgs: list[pb.ProcessingRequest]) -> list[pb.ProcessingResponse]:
    STREAMS["n"] += 1
    try:
        out = _drive(msgs)
    except BaseException:
        STREAMS["failed"] += 1
        raise
    finally:
        if PROGRESS and STREAMS["n"] % 1000 == 0:
            Path(PROGRESS).write_text(f"{STREAMS['n']} streams, {STREAMS['failed']} failed\n")
    return out


def _drive(msgs: list[pb.ProcessingRequest]) -> list[pb.ProcessingResponse]:
    budget = BodyBudget(1 << 20)
    s = RequestStream(
        DIRECTOR,
        256 * 1024,
        body_limits=LIMITS,
        header_limits=HeaderLimits(max_count=100, max_kb=60),
        budget=budget,
    )
    out: list[pb.ProcessingResponse] = []
    immediate = 0
    try:
        for msg in msgs:
            for resp in s.handle(msg):
                check_response(resp)
                immediate += resp.HasField("immediate_response")
                out.append(resp)
    finally:
        s.close()
    assert immediate <= 1, "more than one ImmediateResponse on one stream"
    assert budget.held == 0
    assert all(DATASTORE.inflight(e.name) == (0, 0) for e in DATASTORE.endpoints())
    return out


@FUZZ
@given(sequences())
def test_any_message_sequence_gets_clean_answers_and_leaks_nothing(msgs):
    drive(msgs)
    # The same messages in every body mode Envoy may announce: 3 more streams for the
    # price of one generated example (generation is most of a hypothesis example's cost).
    for mode in (MODES.FULL_DUPLEX_STREAMED, MODES.BUFFERED, MODES.STREAMED):
        drive([with_mode(msg, mode) for msg in msgs])


def with_mode(msg: pb.ProcessingRequest, mode: int) -> pb.ProcessingRequest:
    if not msg.HasField("protocol_config"):
        return msg
    copy = pb.ProcessingRequest()
    copy.CopyFrom(msg)
    copy.protocol_config.request_body_mode = mode
    return copy


@FUZZ
@given(header_msgs, bodies, st.data())
def test_a_body_split_anywhere_gets_the_same_outcome_as_in_one_piece(hdrs, data, draw):
    """Routing aside (the pick may differ), the kind and status of every answer is the
    same whether the body came in one chunk or in pieces."""
    hdrs.request_headers.end_of_stream = False
    whole = drive([hdrs, body(data, True)])
    cuts = sorted(set(draw.draw(st.lists(st.integers(0, len(data)), max_size=8))))
    parts = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    split = drive([hdrs, *(body(p, i == len(parts) - 1) for i, p in enumerate(parts))])

    def shape(responses: list[pb.ProcessingResponse]) -> list[tuple[str, int]]:
        kinds = [(r.WhichOneof("response"), r.immediate_response.status.code) for r in responses]
        # STREAMED mode answers once per chunk: compare the first answer and any refusal
        return kinds[:1] + [k for k in kinds if k[0] == "immediate_response"]

    assert shape(whole) == shape(split)


def test_every_byte_split_of_a_small_body_routes_like_the_whole():
    body_bytes = json.dumps({"model": "m", "prompt": "héllo wörld"}, ensure_ascii=False).encode()
    hdrs = headers("/v1/completions", 0, b"rid-1", False, MODES.FULL_DUPLEX_STREAMED, None)
    for cut in range(len(body_bytes) + 1):
        out = drive([hdrs, body(body_bytes[:cut], False), body(body_bytes[cut:], True)])
        assert out[0].WhichOneof("response") == "request_headers", cut
        returned = b"".join(
            r.request_body.response.body_mutation.streamed_response.body for r in out[1:]
        )
        assert returned == body_bytes
