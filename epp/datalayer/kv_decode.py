"""vLLM KV-cache events: the wire format and its pure decoder (no sockets, no metrics).

Wire format (../shared/REAL_VLLM.md, seen from vLLM 0.32; llm-d-kv-cache
`pkg/kvevents/{zmq_subscriber,events}.go`, `engineadapter/vllm_adapter.go`):

- a message is three frames `[topic, 8-byte big-endian sequence number, payload]`; the
  topic is `kv@<host>:<port>@<model>` (the middle segment names the server);
- the payload is msgpack `[timestamp, [events...], data_parallel_rank]`;
- an event is either a map with a `type` key (vLLM 0.32) or a positional array
  `[tag, ...fields]` (older vLLM, llm-d tools):
  `BlockStored`:  [tag, block_hashes, parent_block_hash, token_ids, block_size, lora_id,
                   medium, lora_name, extra_keys, group_idx, kv_cache_spec_kind, ...]
  `BlockRemoved`: [tag, block_hashes, medium, group_idx]
  `AllBlocksCleared`: [tag]
  Trailing optional fields may be missing and unknown trailing fields are ignored;
- a hash is an int (uint64 or int64; kept as uint64) or bytes (the last 8 bytes read
  big-endian, as llm-d does).

Garbage never raises out of this module uncontrolled: a message or event it cannot use
raises `Malformed(reason)` (or, for one bad event in a batch, is listed in
`EventBatch.skipped`); the subscriber (`epp.datalayer.kvevents`) counts and logs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

_MASK64 = (1 << 64) - 1


# ---- events -------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[Any] | None = None
    kv_cache_spec_kind: str | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: list[int]
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    ts: float
    events: list[KVEvent]
    data_parallel_rank: int | None = None
    # Reasons of the events in the batch that could not be decoded (and were skipped).
    skipped: list[str] = field(default_factory=list)


class Malformed(ValueError):
    """A message or event this decoder cannot use; `reason` labels the drop counter."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


# ---- decoding -------------------------------------------------------------------
def hash_value(x: Any) -> int:
    """An engine block hash as uint64: ints wrap (int64 → uint64), bytes → last 8, BE."""
    if isinstance(x, int) and not isinstance(x, bool):
        return x & _MASK64
    if isinstance(x, bytes | bytearray) and x:
        return int.from_bytes(x[-8:], "big")
    raise Malformed("bad_hash", repr(x)[:40])


def _hashes(x: Any) -> list[int]:
    if not isinstance(x, list | tuple):
        raise Malformed("bad_event", "block_hashes is not a list")
    return [hash_value(h) for h in x]


def _opt_int(x: Any, what: str) -> int | None:
    if x is None:
        return None
    if isinstance(x, int) and not isinstance(x, bool):
        return x
    raise Malformed("bad_event", f"{what} is not an integer")


def _opt_str(x: Any, what: str) -> str | None:
    if x is None or isinstance(x, str):
        return x
    if isinstance(x, bytes):
        return x.decode("utf-8", "replace")
    raise Malformed("bad_event", f"{what} is not a string")


def _tokens(x: Any) -> list[int]:
    if x is None:
        return []
    if not isinstance(x, list) or not all(type(t) is int and t >= 0 for t in x):
        raise Malformed("bad_event", "token_ids is not a list of non-negative integers")
    return x


_STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
)
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")
# Positional events must carry at least these many fields after the tag.
_MIN_FIELDS = {"BlockStored": 4, "BlockRemoved": 1, "AllBlocksCleared": 0}


def _fields(obj: Any) -> tuple[str, dict[str, Any]]:
    """(tag, fields by name) from either wire shape, with length guards."""
    if isinstance(obj, dict):
        tag = obj.get("type")
        if not isinstance(tag, str):
            raise Malformed("bad_event", "map event without a string 'type'")
        return tag, obj
    if isinstance(obj, list | tuple) and obj:
        tag = obj[0]
        if isinstance(tag, bytes):
            tag = tag.decode("utf-8", "replace")
        if not isinstance(tag, str):
            raise Malformed("bad_event", "array event without a string tag")
        names = {"BlockStored": _STORED_FIELDS, "BlockRemoved": _REMOVED_FIELDS}.get(tag, ())
        if tag in _MIN_FIELDS and len(obj) - 1 < _MIN_FIELDS[tag]:
            raise Malformed("bad_event", f"{tag} with {len(obj) - 1} fields")
        return tag, dict(zip(names, obj[1:], strict=False))
    raise Malformed("bad_event", f"event is a {type(obj).__name__}")


def decode_event(obj: Any) -> KVEvent:
    tag, f = _fields(obj)
    if tag == "BlockStored":
        if "block_hashes" not in f:
            raise Malformed("bad_event", "BlockStored without block_hashes")
        parent = f.get("parent_block_hash")
        extra = f.get("extra_keys")
        return BlockStored(
            block_hashes=_hashes(f["block_hashes"]),
            parent_block_hash=None if parent is None else hash_value(parent),
            token_ids=_tokens(f.get("token_ids")),
            block_size=_opt_int(f.get("block_size"), "block_size") or 0,
            lora_id=_opt_int(f.get("lora_id"), "lora_id"),
            medium=_opt_str(f.get("medium"), "medium"),
            lora_name=_opt_str(f.get("lora_name"), "lora_name"),
            extra_keys=extra if isinstance(extra, list) else None,
            kv_cache_spec_kind=_opt_str(f.get("kv_cache_spec_kind"), "kv_cache_spec_kind"),
        )
    if tag == "BlockRemoved":
        if "block_hashes" not in f:
            raise Malformed("bad_event", "BlockRemoved without block_hashes")
        return BlockRemoved(_hashes(f["block_hashes"]), _opt_str(f.get("medium"), "medium"))
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    raise Malformed("unknown_event", tag[:40])


def decode_payload(payload: bytes) -> EventBatch:
    """`[ts, [events...], dp_rank]` → EventBatch; raises Malformed for an unusable batch.

    Events that cannot be decoded are skipped and listed in `skipped` (by reason).
    """
    try:
        obj = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as e:  # msgpack raises many types on garbage
        raise Malformed("bad_msgpack", type(e).__name__) from None
    if isinstance(obj, dict):  # tolerate a map-shaped batch too
        obj = [obj.get("ts"), obj.get("events"), obj.get("data_parallel_rank")]
    if not isinstance(obj, list | tuple) or len(obj) < 2:
        raise Malformed("bad_batch", "payload is not [ts, events, ...]")
    ts, raw_events = obj[0], obj[1]
    if not isinstance(raw_events, list | tuple):
        raise Malformed("bad_batch", "events is not a list")
    rank = obj[2] if len(obj) > 2 and isinstance(obj[2], int) else None
    events: list[KVEvent] = []
    skipped: list[str] = []
    for raw in raw_events:
        try:
            events.append(decode_event(raw))
        except Malformed as m:
            skipped.append(m.reason)
    stamp = float(ts) if isinstance(ts, int | float) and not isinstance(ts, bool) else 0.0
    return EventBatch(stamp, events, rank, skipped)


def decode_frames(frames: Sequence[bytes]) -> tuple[str, int, EventBatch]:
    """`[topic, seq, payload]` → (topic, seq, batch); raises Malformed."""
    if len(frames) != 3:
        raise Malformed("bad_frames", f"{len(frames)} frames, expected 3")
    raw_topic, raw_seq, payload = frames
    try:
        topic = bytes(raw_topic).decode("utf-8")
    except UnicodeDecodeError:
        raise Malformed("bad_topic", "not UTF-8") from None
    if len(raw_seq) != 8:
        raise Malformed("bad_seq", f"{len(raw_seq)} bytes, expected 8")
    return topic, int.from_bytes(raw_seq, "big"), decode_payload(bytes(payload))


def parse_topic(topic: str) -> tuple[str, str]:
    """`kv@<host:port>@<model>` → (host:port, model); the model may be absent ("")."""
    parts = topic.split("@", 2)
    if len(parts) < 2 or not parts[1]:
        raise Malformed("bad_topic", topic[:80])
    return parts[1], parts[2] if len(parts) == 3 else ""
