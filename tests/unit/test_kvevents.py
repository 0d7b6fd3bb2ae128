"""vLLM KV-event decoding and the subscriber's receive path (no sockets here).

Messages are built by hand exactly as ../shared/REAL_VLLM.md describes: three frames
`[topic, 8-byte big-endian seq, msgpack [ts, [events...], dp_rank]]`, each event either
a map with a `type` key (vLLM 0.32) or a positional array `[tag, ...]` (older vLLM).
The builders here are shared by the other KV-event tests.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from epp.datalayer.kv_decode import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Malformed,
    decode_event,
    decode_frames,
    decode_payload,
    hash_value,
    parse_topic,
)
from epp.datalayer.kvevents import KVEventSubscriber
from epp.datastore import Endpoint
from epp.observability import REGISTRY


# ---- builders (vLLM's wire format) ----------------------------------------------------
def stored_array(
    hashes: list[int],
    parent: int | None,
    tokens: list[int],
    block_size: int,
    medium: str | None = "GPU",
    *extra: Any,
) -> list[Any]:
    """Positional BlockStored: [tag, block_hashes, parent, token_ids, block_size,
    lora_id, medium, lora_name, ...]."""
    return ["BlockStored", hashes, parent, tokens, block_size, None, medium, None, *extra]


def stored_map(
    hashes: list[int],
    parent: int | None,
    tokens: list[int],
    block_size: int,
    medium: str | None = "GPU",
    **extra: Any,
) -> dict[str, Any]:
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": block_size,
        "lora_id": None,
        "medium": medium,
        "lora_name": None,
        **extra,
    }


def removed_array(hashes: list[int], medium: str | None = "GPU") -> list[Any]:
    return ["BlockRemoved", hashes, medium]


def removed_map(hashes: list[int], medium: str | None = "GPU") -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium}


def message(topic: str, seq: int, events: list[Any], rank: int | None = 0) -> list[bytes]:
    batch: list[Any] = [1700000000.5, events] + ([rank] if rank is not None else [])
    return [topic.encode(), seq.to_bytes(8, "big"), msgpack.packb(batch)]


# ---- decoding -------------------------------------------------------------------------
def test_positional_block_stored_with_missing_and_unknown_trailing_fields():
    ev = decode_event(stored_array([1, 2], None, [5, 6, 7, 8], 2))
    assert ev == BlockStored([1, 2], None, [5, 6, 7, 8], 2, None, "GPU", None)
    minimal = decode_event(["BlockStored", [1], 7, [5, 6], 2])
    assert minimal == BlockStored([1], 7, [5, 6], 2)
    longer = stored_array([1], None, [5, 6], 2, "CPU", [["salt"]], 0, "full_attention", None, 42)
    ev = decode_event(longer)
    assert isinstance(ev, BlockStored)
    assert (ev.medium, ev.extra_keys, ev.kv_cache_spec_kind) == (
        "CPU",
        [["salt"]],
        "full_attention",
    )


def test_map_events_of_every_type():
    ev = decode_event(stored_map([3], 9, [1, 2], 2, medium=None, future_field={"x": 1}))
    assert ev == BlockStored([3], 9, [1, 2], 2)
    assert decode_event(removed_map([3, 4], "CPU")) == BlockRemoved([3, 4], "CPU")
    assert decode_event({"type": "AllBlocksCleared"}) == AllBlocksCleared()
    assert decode_event(removed_array([5])) == BlockRemoved([5], "GPU")
    assert decode_event(["BlockRemoved", [5]]) == BlockRemoved([5], None)
    assert decode_event(["AllBlocksCleared"]) == AllBlocksCleared()


def test_hashes_as_int64_uint64_or_bytes():
    assert hash_value(-1) == (1 << 64) - 1
    assert hash_value((1 << 64) - 2) == (1 << 64) - 2
    sha = bytes(range(32))
    assert hash_value(sha) == int.from_bytes(sha[-8:], "big")
    ev = decode_event(stored_array([sha], sha, [1], 1))
    assert isinstance(ev, BlockStored)
    assert ev.block_hashes == [int.from_bytes(sha[-8:], "big")] and ev.parent_block_hash is not None


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (["BlockStored", [1], None], "bad_event"),  # too short
        (["BlockStored", "nope", None, [1], 1], "bad_event"),
        (["BlockStored", [1.5], None, [1], 1], "bad_hash"),
        (["BlockStored", [1], None, [1, "x"], 1], "bad_event"),
        (["BlockStored", [1], None, [1], "16"], "bad_event"),
        (["BlockRemoved"], "bad_event"),
        ({"type": "BlockStored"}, "bad_event"),
        ({"kind": "BlockStored"}, "bad_event"),
        (["BlockMoved", [1]], "unknown_event"),
        ({"type": "SomethingNew", "x": 1}, "unknown_event"),
        ([], "bad_event"),
        ("BlockStored", "bad_event"),
        ([42, [1]], "bad_event"),
    ],
)
def test_bad_events_raise_malformed_with_a_reason(raw, reason):
    with pytest.raises(Malformed) as e:
        decode_event(raw)
    assert e.value.reason == reason


def test_a_batch_skips_its_bad_events_and_keeps_the_good_ones():
    payload = msgpack.packb(
        [1.0, [["Nope"], stored_array([1], None, [1], 1), {"type": "AllBlocksCleared"}], 3]
    )
    batch = decode_payload(payload)
    assert batch.events == [BlockStored([1], None, [1], 1, None, "GPU"), AllBlocksCleared()]
    assert (batch.skipped, batch.data_parallel_rank, batch.ts) == (["unknown_event"], 3, 1.0)
    assert decode_payload(msgpack.packb([2, []])).data_parallel_rank is None


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"\xc1", "bad_msgpack"),  # a byte msgpack never uses
        (b"\x93\x01", "bad_msgpack"),  # truncated
        (msgpack.packb("hello"), "bad_batch"),
        (msgpack.packb([1.0]), "bad_batch"),
        (msgpack.packb([1.0, 7]), "bad_batch"),
    ],
)
def test_bad_payloads_raise_malformed(payload, reason):
    with pytest.raises(Malformed) as e:
        decode_payload(payload)
    assert e.value.reason == reason


def test_frames_and_topics():
    topic, seq, batch = decode_frames(message("kv@10.0.0.1:8000@m", 7, [["AllBlocksCleared"]]))
    assert (topic, seq, batch.events) == ("kv@10.0.0.1:8000@m", 7, [AllBlocksCleared()])
    assert parse_topic("kv@10.0.0.1:8000@org/model@v2") == ("10.0.0.1:8000", "org/model@v2")
    assert parse_topic("kv@10.0.0.1:8000") == ("10.0.0.1:8000", "")
    for frames, reason in (
        ([b"kv@a@m", b"\x00" * 8], "bad_frames"),
        ([b"kv@a@m", b"\x00" * 4, msgpack.packb([1, []])], "bad_seq"),
        ([b"\xff\xfe", b"\x00" * 8, msgpack.packb([1, []])], "bad_topic"),
    ):
        with pytest.raises(Malformed) as e:
            decode_frames(frames)
        assert e.value.reason == reason
    with pytest.raises(Malformed):
        parse_topic("kv")


# ---- the receive path -------------------------------------------------------------------
POOL = [Endpoint("a", "10.0.0.1", 8000), Endpoint("b", "10.0.0.2", 8000)]


def subscriber(received: list) -> KVEventSubscriber:
    sub = KVEventSubscriber(
        lambda name, model, batch: received.append((name, model, batch.events)),
        pool=lambda: POOL,
    )
    sub._refresh_pods()  # what start() does, without sockets
    return sub


def test_topic_names_the_endpoint_by_host_port_or_name():
    got: list = []
    sub = subscriber(got)
    assert sub.handle_frames(message("kv@10.0.0.2:8000@m", 0, [["AllBlocksCleared"]]))
    assert sub.handle_frames(message("kv@a@m2", 0, [["AllBlocksCleared"]]))
    assert [(n, m) for n, m, _ in got] == [("b", "m"), ("a", "m2")]
    # In connect mode the socket names the endpoint, whatever the topic says.
    assert sub.handle_frames(message("kv@127.0.0.1:9@m", 1, []), endpoint="b")
    assert got[-1][0] == "b"


def test_garbage_is_counted_and_logged_never_raised(caplog):
    got: list = []
    sub = subscriber(got)

    def dropped(reason: str) -> float:
        return REGISTRY.get_sample_value("epp_kv_events_dropped_total", {"reason": reason}) or 0

    before = dropped("bad_msgpack")
    garbage = [
        [b"kv@10.0.0.1:8000@m", b"\x00" * 8, b"\xc1\xc1"],
        [b"kv@10.0.0.1:8000@m", b"\x00" * 8],
        [b"kv@10.0.0.1:8000@m", b"\x00" * 3, b""],
        [b"\xff", b"\x00" * 8, b""],
        [b"kv@10.9.9.9:1@m", b"\x00" * 8, msgpack.packb([1, []])],
        [b"kv@10.0.0.1:8000@m", b"\x00" * 8, b"\xc1\xc1"],
    ]
    for frames in garbage:
        assert sub.handle_frames(frames) is False
    assert got == []
    assert dict(sub.stats) == {
        "dropped:bad_msgpack": 2,
        "dropped:bad_frames": 1,
        "dropped:bad_seq": 1,
        "dropped:bad_topic": 1,
        "dropped:unknown_endpoint": 1,
    }
    assert dropped("bad_msgpack") == before + 2
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 5  # once per reason


def test_bad_events_inside_a_good_message_are_counted_and_the_rest_applied():
    got: list = []
    sub = subscriber(got)
    msg = message("kv@a@m", 0, [["Nope"], ["BlockRemoved", [1]], ["BlockStored", [1]]])
    assert sub.handle_frames(msg)
    assert got == [("a", "m", [BlockRemoved([1])])]
    assert sub.stats["dropped:unknown_event"] == 1 and sub.stats["dropped:bad_event"] == 1


def test_a_failing_handler_is_counted_not_raised():
    def broken(name, model, batch):
        raise RuntimeError("bug")

    sub = KVEventSubscriber(broken, pool=lambda: POOL)
    sub._refresh_pods()
    assert sub.handle_frames(message("kv@a@m", 0, [])) is False
    assert sub.stats["dropped:handler_error"] == 1


def test_sequence_gaps_are_counted_per_endpoint():
    got: list = []
    sub = subscriber(got)
    before = REGISTRY.get_sample_value("epp_kv_events_sequence_gaps_total") or 0
    for seq in (0, 1, 2, 5, 6):
        sub.handle_frames(message("kv@a@m", seq, []))
    for seq in (10, 11):  # another endpoint's own numbering: no gap
        sub.handle_frames(message("kv@b@m", seq, []))
    for seq in (0, 1):  # another data-parallel rank of "a" numbers its own messages
        sub.handle_frames(message("kv@a@m", seq, [], rank=1))
    assert sub.stats["sequence_gaps"] == 1
    assert REGISTRY.get_sample_value("epp_kv_events_sequence_gaps_total") == before + 1
    assert len(got) == 9


def test_connect_mode_addresses_follow_the_label_or_default_port():
    sub = KVEventSubscriber(lambda *a: None, mode="connect", publisher_port=5557)
    assert sub.publisher_address(Endpoint("a", "10.0.0.1", 8000)) == "tcp://10.0.0.1:5557"
    labelled = Endpoint("b", "10.0.0.2", 8000, {"epp.kv-events-port": "6001"})
    assert sub.publisher_address(labelled) == "tcp://10.0.0.2:6001"
    assert sub.publisher_address(Endpoint("c", "fd00::1", 8000)) == "tcp://[fd00::1]:5557"
    bad = Endpoint("d", "10.0.0.4", 8000, {"epp.kv-events-port": "x"})
    assert sub.publisher_address(bad) is None
    assert sub.stats["dropped:bad_port_label"] == 1
    with pytest.raises(ValueError, match="mode must be one of"):
        KVEventSubscriber(lambda *a: None, mode="both")


def test_the_decoder_module_is_pure():
    """kv_decode holds the wire format only: no sockets, event loop, metrics or logging."""
    import ast
    from pathlib import Path

    import epp.datalayer.kv_decode as mod

    tree = ast.parse(Path(mod.__file__).read_text())
    imported = {
        (n.module if isinstance(n, ast.ImportFrom) else a.name).split(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, ast.Import | ast.ImportFrom)
        for a in n.names
    }
    assert imported <= {"__future__", "collections", "dataclasses", "typing", "msgpack"}
