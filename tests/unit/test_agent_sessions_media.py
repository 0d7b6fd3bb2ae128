"""Sessions as clients send them, prompt_cache_key as a prefix hint, and media items in
the prefix identity (approximate chains diverge at the first differing item; the
precise index stops before the first item)."""

from __future__ import annotations

import json
import random

import pytest

from epp.config.params import parse_params
from epp.limits import BodyLimits
from epp.request import new_request, parse_body
from epp.scheduling.registry import PLUGIN_TYPES, Handle
from epp.scheduling.types import CycleState, ProfileResult, SchedulingResult
from epp.session_key import DEFAULT_SOURCES, parse_sources, session_key
from epp.tokenizer import SimpleTokenizer
from tests.helpers import snap
from tests.unit.test_kvevents import stored_map
from tests.unit.test_prefix_precise import producer as precise_producer
from tests.unit.test_prefix_precise import send

A, B, C = snap("a", port=8001), snap("b", port=8002), snap("c", port=8003)
EPS = [A, B, C]


def chat(body: dict, headers: dict | None = None, path="/v1/chat/completions", limits=None):
    raw = json.dumps({"model": "m", **body}).encode()
    return parse_body(new_request(headers or {}, path, "POST"), raw, limits or BodyLimits())


# ---- session keys -------------------------------------------------------------------
def test_session_key_sources_in_order():
    every = {
        "x-claude-code-session-id": "claude",
        "x-session-affinity": "opencode",
        "session-id": "codex",
        "session_id": "codex-old",
        "x-session-token": "token",
    }
    body = {"prompt_cache_key": "pck", "metadata": {"user_id": "anthropic"}, "user": "openai"}
    expected = ["claude", "opencode", "codex", "codex-old", "pck", "anthropic", "openai", "token"]
    headers = dict(every)
    for want in expected:
        assert session_key(headers, body, DEFAULT_SOURCES) == want
        # take the winner away: the next source in the list answers
        for h, v in list(headers.items()):
            if v == want:
                del headers[h]
        for k in ("prompt_cache_key", "user"):
            if body.get(k) == want:
                body = {**body, k: ""}  # empty counts as absent
        if body.get("metadata", {}).get("user_id") == want:
            body = {**body, "metadata": {}}
    assert session_key(headers, body, DEFAULT_SOURCES) is None


def test_session_key_is_bounded_and_sources_configurable():
    long = "s" * 500
    key = session_key({"x-session-token": long}, None, DEFAULT_SOURCES)
    assert key is not None and key.startswith("blake2b:") and len(key) < 128
    assert session_key({"x-session-token": "tab\there"}, None, DEFAULT_SOURCES).startswith(
        "blake2b:"
    )
    sources = parse_sources("body:metadata.user_id, header:X-Tenant")
    assert sources == ("body:metadata.user_id", "header:x-tenant")
    assert session_key({"x-tenant": "t1", "x-session-token": "s"}, {}, sources) == "t1"
    assert parse_sources("") == ()
    with pytest.raises(ValueError, match="cookie:x"):
        parse_sources("cookie:x")


def test_session_key_is_the_default_fairness_id_and_an_explicit_one_wins():
    r = chat({"messages": [{"role": "user", "content": "hi"}], "user": "u1"})
    assert (r.session_key, r.fairness_key) == ("u1", "u1")
    r = chat(
        {"messages": [{"role": "user", "content": "hi"}], "user": "u1"},
        headers={"x-gateway-inference-fairness-id": "tenant-a"},
    )
    assert (r.session_key, r.fairness_key) == ("u1", "tenant-a")
    r = chat(
        {"messages": [{"role": "user", "content": "hi"}], "user": "u1"},
        limits=BodyLimits(session_sources=()),
    )
    assert (r.session_key, r.fairness_key) == (None, None)


def test_session_scorer_follows_the_session_key_from_any_source():
    spec = PLUGIN_TYPES.lookup("session-affinity-scorer")
    scorer = spec.build("s", parse_params(spec.params, {}), Handle(rng=random.Random(0)))
    first = chat(
        {"messages": [{"role": "user", "content": "hi"}]},
        headers={"x-claude-code-session-id": "sess-1"},
    )
    scorer.pre_request(first, SchedulingResult({"p": ProfileResult([B])}, "p"))
    again = chat(
        {"messages": [{"role": "user", "content": "more"}], "user": "someone"},
        headers={"x-claude-code-session-id": "sess-1"},
    )
    assert scorer.score(CycleState(), again, EPS) == [0.0, 1.0, 0.0]
    messages = chat(
        {
            "max_tokens": 4,
            "messages": [{"role": "user", "content": "x"}],
            "metadata": {"user_id": "sess-1"},
        },
        path="/v1/messages",
    )
    assert scorer.score(CycleState(), messages, EPS) == [0.0, 1.0, 0.0]


# ---- prompt_cache_key as a prefix hint ------------------------------------------------
def approx(params: dict | None = None):
    spec = PLUGIN_TYPES.lookup("approx-prefix-cache-producer")
    p = {"blockSizeTokens": 1, **(params or {})}
    return spec.build("approx", parse_params(spec.params, p), Handle(rng=random.Random(0)))


def route(prod, request, target):
    state = CycleState()
    info = prod.produce(state, request, EPS)
    state.write(prod.produces, info)
    prod.pre_request(
        request, SchedulingResult({"p": ProfileResult([target])}, "p", cycle_state=state)
    )
    return info


def test_prompt_cache_key_stands_in_only_where_the_index_has_no_evidence():
    prod = approx()
    first = chat({"messages": [{"role": "user", "content": "aaaa" * 10}], "prompt_cache_key": "k"})
    assert route(prod, first, B).matched == {}
    # Nothing in common with the first prompt's blocks (a different opening): the key
    # sends it where the key's last request went, up to that request's length.
    other = chat({"messages": [{"role": "system", "content": "zz" * 30}], "prompt_cache_key": "k"})
    info = prod.produce(CycleState(), other, EPS)
    assert set(info.matched) == {"b"} and 0 < info.cached_blocks["b"] < info.total_blocks
    # Without the key, or with another key, or another model: no hint.
    assert prod.produce(CycleState(), chat({"messages": other.body["messages"]}), EPS).matched == {}
    rekeyed = chat({"messages": other.body["messages"], "prompt_cache_key": "k2"})
    assert prod.produce(CycleState(), rekeyed, EPS).matched == {}
    # Real evidence wins: a request sharing blocks with what A holds gets A's match only.
    route(prod, chat({"messages": [{"role": "developer", "content": "cccc" * 10}]}), A)
    evidence = chat(
        {"messages": [{"role": "developer", "content": "cccc" * 10 + "d"}], "prompt_cache_key": "k"}
    )
    assert set(prod.produce(CycleState(), evidence, EPS).matched) == {"a"}


# ---- media in the prefix identity -----------------------------------------------------
def image(data: str) -> dict:
    return {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}


def with_image(data: str, tail: str = "describe it") -> dict:
    text = {"type": "text", "text": "The same long question about a picture, " * 4}
    return {
        "messages": [
            {"role": "user", "content": [text, image(data), {"type": "text", "text": tail}]}
        ]
    }


@pytest.mark.parametrize("tokenizer", [None, "simple"])
def test_approx_chains_diverge_at_the_first_differing_image_and_share_identical_ones(tokenizer):
    prod = approx({"tokenizer": tokenizer} if tokenizer else {})
    one, two = chat(with_image("AAAA")), chat(with_image("BBBB"))
    same = chat(with_image("AAAA", tail="and again"))
    h1, h2, h3 = (prod.hashes(r, 1) for r in (one, two, same))
    # the blocks before the image are shared; the image's block differs
    k = next(i for i, (x, y) in enumerate(zip(h1, h2, strict=False)) if x != y)
    # the marker's first differing unit: the digest's first character (after a space),
    # or its first token
    if tokenizer is None:
        assert k == (one.media_at + 1) // 4  # 4 characters a block without a tokenizer
    else:
        assert k == len(SimpleTokenizer().encode(one.prompt_text[: one.media_at]))
    # an identical image: shared through the image and up to the differing tail
    j = next(i for i, (x, y) in enumerate(zip(h1, h3, strict=False)) if x != y)
    assert j > k + 1
    # routed: the second image's request matches only the blocks before the image
    route(prod, one, A)
    assert prod.produce(CycleState(), two, EPS).cached_blocks["a"] == k
    # an image-only message still records a prefix
    alone = chat({"messages": [{"role": "user", "content": [image("CCCC")]}]})
    assert prod.hashes(alone, 1)


def test_precise_match_stops_at_the_block_before_the_first_media_item():
    prod = precise_producer({"blockSizeTokens": 4})
    req = chat(with_image("AAAA"))
    ids = SimpleTokenizer().encode(req.prompt_text)
    before = len(SimpleTokenizer().encode(req.prompt_text[: req.media_at]))
    assert before // 4 >= 2, "the test needs whole blocks before the image"
    # the server reports the whole prompt's blocks (as if it had hashed them its way)
    full = len(ids) // 4
    send(prod, "a", [stored_map(list(range(1, full + 1)), None, ids[: full * 4], 4)])
    info = prod.produce(CycleState(), req, EPS)
    assert info.cached_blocks["a"] == before // 4  # never past the block before the image
    assert info.total_blocks == full
    assert len(info.chains[4]) == before // 4
    # the same prompt without media matches everything the server holds
    text_only = chat({"messages": [{"role": "user", "content": req.prompt_text}]})
    assert not text_only.media
