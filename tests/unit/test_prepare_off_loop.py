"""Tokenizing a large prompt off the event loop (issue 13 §6): with a tokenizing prefix
producer, a body over PREPARE_OFF_LOOP_BYTES is parsed and tokenized in a worker thread
(`Scheduler.prepare`), a small one inline, and both route exactly as the inline path."""

from __future__ import annotations

import json
import random
import threading

from epp.config.loader import load_config_text, load_default_config
from epp.datastore import Datastore, Endpoint
from epp.director import Director
from epp.extproc.stream import PARSE_OFF_LOOP_BYTES, PREPARE_OFF_LOOP_BYTES, RequestStream
from epp.headers import REQUEST_ID
from epp.scheduling.registry import Handle
from tests.unit.test_stream import body_msg, headers_msg

CONFIG = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: approx-prefix-cache-producer
  parameters:
    tokenizer: simple
- type: prefix-cache-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
  - pluginRef: max-score-picker
"""

HEADERS = {":path": "/v1/completions", ":method": "POST", REQUEST_ID: "rid-1"}


def tokenizing_director() -> tuple[Director, list[str]]:
    """A director whose tokenizer records the thread of every encode."""
    ds = Datastore(require_metrics=False)
    ds.set_endpoints([Endpoint(f"e{i}", f"10.0.0.{i + 1}", 8000) for i in range(3)])
    cfg = load_config_text(CONFIG, handle=Handle(rng=random.Random(0)))
    (producer,) = cfg.scheduler.preparers
    threads: list[str] = []
    tokenizer = producer.tokenizer
    encode = tokenizer.encode

    def recording_encode(*a, **kw):
        threads.append(threading.current_thread().name)
        return encode(*a, **kw)

    tokenizer.encode = recording_encode  # type: ignore[method-assign]
    return Director(ds, cfg.scheduler, cfg.pre_request, random.Random(0)), threads


def body_of(chars: int) -> bytes:
    return json.dumps({"model": "m", "prompt": "token " * (chars // 6)}).encode()


async def route(director: Director, body: bytes, use_async: bool = True) -> list:
    stream = RequestStream(director, 64 << 20)
    out = []
    for msg in (headers_msg(HEADERS), body_msg(body, eos=True)):
        out += await stream.handle_async(msg) if use_async else stream.handle(msg)
    return out


async def test_a_large_prompt_is_tokenized_in_a_worker_thread_once():
    director, threads = tokenizing_director()
    body = body_of(PREPARE_OFF_LOOP_BYTES * 2)
    assert PREPARE_OFF_LOOP_BYTES < len(body) < PARSE_OFF_LOOP_BYTES  # only the tokenizer
    out = await route(director, body)
    loop_thread = threading.current_thread().name
    assert len(threads) == 1 and threads[0] != loop_thread  # once, and not on the loop
    # the same answer as the synchronous path (which tokenizes inline)
    inline_director, inline_threads = tokenizing_director()
    assert out == await route(inline_director, body, use_async=False)
    assert inline_threads == [loop_thread]


async def test_a_small_prompt_stays_on_the_loop():
    director, threads = tokenizing_director()
    body = body_of(PREPARE_OFF_LOOP_BYTES // 2)
    await route(director, body)
    assert threads == [threading.current_thread().name]


def test_without_a_tokenizer_nothing_prepares():
    cfg = load_default_config(Handle(rng=random.Random(0)))
    assert cfg.scheduler.preparers == []
    director = Director(Datastore(), cfg.scheduler)
    assert not director.prepares
