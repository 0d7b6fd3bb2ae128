"""The simulator's parts without HTTP: tokenizer, config, request parsing, engine."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from epp.sim.config import Faults, SimConfig
from epp.sim.engine import Aborted, Engine, SimRequest, State, Token
from epp.sim.openai import ApiError, parse, render_chat
from epp.sim.tokenizer import count_tokens, filler_text, filler_token, tokenize

# -- tokenizer -------------------------------------------------------------------------


def test_tokenizer_counts_words_and_punctuation() -> None:
    assert tokenize("Hello, world!") == ["Hello", ",", "world", "!"]
    assert count_tokens("Hello, world!") == 4
    assert count_tokens("") == 0
    assert count_tokens("  spaced   out\n") == 2


def test_filler_is_one_token_each() -> None:
    assert all(count_tokens(filler_token(i)) == 1 for i in range(100))
    assert count_tokens(filler_text(37)) == 37
    assert filler_text(5) == filler_text(5)  # deterministic


# -- config ------------------------------------------------------------------------------


def test_config_validation_and_derived_values() -> None:
    config = SimConfig(lora_modules=["a"], kv_capacity_tokens=1024, block_size=32)  # type: ignore[arg-type]
    assert config.lora_modules == ("a",)
    assert config.served_models == ("tiny", "a")
    assert config.num_gpu_blocks == 32
    for bad in [
        {"max_num_seqs": 0},
        {"time_scale": 0},
        {"failure_rate": 1.5},
        {"decode_ms_per_token": -1},
        {"kv_capacity_tokens": 8, "block_size": 16},
    ]:
        with pytest.raises(ValueError):
            SimConfig(**bad)  # type: ignore[arg-type]


def test_fault_updates_are_all_or_nothing() -> None:
    faults = Faults()
    faults.update({"delay_ms": 10, "fixed_queue": 3})
    assert faults.to_dict() == {
        "delay_ms": 10.0,
        "fail_rate": 0.0,
        "metrics": True,
        "healthy": True,
        "fixed_queue": 3,
    }
    with pytest.raises(ValueError):
        faults.update({"delay_ms": 20, "fail_rate": 7})
    assert faults.delay_ms == 10.0
    with pytest.raises(ValueError, match="unknown"):
        faults.update({"latency": 1})


# -- request parsing --------------------------------------------------------------------

CONFIG = SimConfig(default_max_tokens=16, kv_capacity_tokens=1024)


def test_parse_completion_prompt_forms() -> None:
    assert parse("completion", {"prompt": "a b c"}, CONFIG).prompt_tokens == (3,)
    assert parse("completion", {"prompt": [5, 6]}, CONFIG).prompt_tokens == (2,)
    assert parse("completion", {"prompt": ["a", [1, 2, 3]]}, CONFIG).prompt_tokens == (1, 3)
    assert parse("completion", {"prompt": ""}, CONFIG).prompt_tokens == (0,)
    for bad in [[], [None], [[]], {"x": 1}, None]:
        with pytest.raises(ApiError):
            parse("completion", {"prompt": bad}, CONFIG)


def test_parse_limits_and_reasons() -> None:
    req = parse("completion", {"prompt": "x"}, CONFIG)
    assert (req.max_tokens, req.finish_reason) == (16, "stop")
    req = parse("completion", {"prompt": "x", "max_tokens": 3}, CONFIG)
    assert (req.max_tokens, req.finish_reason) == (3, "length")
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 3}
    assert parse("chat", body, CONFIG).max_tokens == 3
    body["max_completion_tokens"] = 5
    assert parse("chat", body, CONFIG).max_tokens == 5
    req = parse("chat", {**body, "stream": True, "stream_options": {"include_usage": True}}, CONFIG)
    assert req.stream and req.include_usage
    with pytest.raises(ApiError) as e:
        parse("completion", {"prompt": "x " * 1020, "max_tokens": 10}, CONFIG)
    assert e.value.status == 400
    with pytest.raises(ApiError) as e:
        parse("completion", {"prompt": "x", "model": "other"}, CONFIG)
    assert e.value.status == 404


def test_chat_template_costs_tokens() -> None:
    text = render_chat([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    assert "hi" in text
    assert count_tokens(text) > 1


# -- engine -------------------------------------------------------------------------------


def fast(**overrides: object) -> SimConfig:
    return SimConfig(**{"decode_ms_per_token": 1.0, "time_scale": 20.0, **overrides})  # type: ignore[arg-type]


async def drain(req: SimRequest) -> list[Token | Aborted]:
    events: list[Token | Aborted] = []
    while not events or (isinstance(events[-1], Token) and events[-1].finish_reason is None):
        events.append(await asyncio.wait_for(req.sink.get(), 10))
    return events


def new_request(prompt: int = 4, max_tokens: int = 3, **kw: object) -> SimRequest:
    return SimRequest(prompt, max_tokens, asyncio.Queue(), **kw)  # type: ignore[arg-type]


async def test_engine_fifo_one_slot() -> None:
    engine = Engine(fast(max_num_seqs=1))
    engine.start()
    try:
        reqs = [new_request() for _ in range(3)]
        for r in reqs:
            engine.submit(r)
        results = [await drain(r) for r in reqs]
        for events in results:
            assert [e.index for e in events if isinstance(e, Token)] == [0, 1, 2]
            assert events[-1].finish_reason == "length"  # type: ignore[union-attr]
        assert engine.max_running_seen == 1
        # Each request starts only after the previous one finished.
        for earlier, later in itertools.pairwise(reqs):
            assert earlier.finished_at is not None and later.admitted_at is not None
            assert later.admitted_at >= earlier.finished_at
        assert all(r.state is State.FINISHED for r in reqs)
    finally:
        await engine.stop()


async def test_engine_kv_capacity_limits_admission() -> None:
    # Each request reserves 40 of 64 tokens: two never fit together.
    engine = Engine(fast(kv_capacity_tokens=64, block_size=16))
    engine.start()
    try:
        reqs = [new_request(prompt=30, max_tokens=10) for _ in range(3)]
        for r in reqs:
            engine.submit(r)
        for r in reqs:
            await drain(r)
        assert engine.max_running_seen == 1
    finally:
        await engine.stop()


async def test_engine_step_cost_and_timestamps() -> None:
    config = fast(prefill_ms_per_token=0.5, decode_ms_per_token=4.0, batch_slowdown=0.5)
    engine = Engine(config)
    a, b = new_request(prompt=10), new_request(prompt=30)
    assert engine.step_seconds([a, b], []) == pytest.approx(0.020)
    assert engine.step_seconds([], [a]) == pytest.approx(0.004)
    assert engine.step_seconds([], [a, b]) == pytest.approx(0.006)
    assert engine.step_seconds([a], [b]) == pytest.approx(0.009)

    engine.start()
    try:
        req = new_request(prompt=100, max_tokens=4)
        engine.submit(req)
        events = await drain(req)
        times = [e.time for e in events if isinstance(e, Token)]
        # Prefill 50 ms of model time, then one token per 4 ms decode step at least.
        assert times[0] - req.arrival >= 0.050 - 1e-9
        assert all(t2 - t1 >= 0.004 - 1e-9 for t1, t2 in itertools.pairwise(times))
    finally:
        await engine.stop()


async def test_engine_delay_lets_ready_requests_pass() -> None:
    engine = Engine(fast(max_num_seqs=1))
    engine.start()
    try:
        delayed, ready = new_request(max_tokens=1), new_request(max_tokens=1)
        engine.submit(delayed, delay_seconds=0.5)
        engine.submit(ready)
        await drain(ready)
        assert delayed.state is State.WAITING
        assert engine.snapshot().waiting == 1
        await drain(delayed)
        assert delayed.first_token_at is not None
        assert delayed.first_token_at - delayed.arrival >= 0.5
    finally:
        await engine.stop()


async def test_engine_snapshot_abort_and_stop() -> None:
    config = fast(
        max_num_seqs=1,
        decode_ms_per_token=1000.0,
        time_scale=1.0,
        lora_modules=("ad",),
        kv_capacity_tokens=1600,
    )
    engine = Engine(config)
    engine.start()
    try:
        running = new_request(prompt=31, max_tokens=1000, model="ad")
        queued = new_request(max_tokens=5, model="tiny")
        gone = new_request(max_tokens=5)
        for r in (running, queued, gone):
            engine.submit(r)
        first = await asyncio.wait_for(running.sink.get(), 10)
        assert isinstance(first, Token) and first.index == 0
        snap = engine.snapshot()
        assert (snap.running, snap.waiting) == (1, 2)
        assert snap.kv_usage == pytest.approx(2 / 100)  # 32 tokens held = 2 of 100 blocks
        assert snap.running_models == ("ad",)
        engine.abort(gone)
        assert engine.snapshot().waiting == 1
        engine.abort(gone)  # twice is harmless
    finally:
        await engine.stop()
    assert isinstance(await queued.sink.get(), Aborted)
    assert running.state is State.ABORTED
    with pytest.raises(RuntimeError):
        engine.submit(new_request())


async def test_engine_crash_fails_requests_instead_of_hanging() -> None:
    class Broken:
        def on_admit(self, req: SimRequest, queue_seconds: float) -> None:
            raise RuntimeError("bug")

    engine = Engine(fast(), observer=Broken())  # type: ignore[arg-type]
    engine.start()
    try:
        req = new_request()
        engine.submit(req)
        event = await asyncio.wait_for(req.sink.get(), 10)
        assert isinstance(event, Aborted)
        assert "crashed" in event.reason
    finally:
        await engine.stop()
