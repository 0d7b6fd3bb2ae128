"""KV-cache events over ZMQ, byte for byte as vLLM's `ZmqEventPublisher` sends them
(vllm/distributed/kv_events.py; see ../shared/REAL_VLLM.md).

- One PUB socket per server. vLLM's rule for the endpoint: an address with `*` (or
  `::`, or an ipc/inproc one) is *bound* by the server; any other is *connected* to, so
  the subscriber binds it. With `--replicas N`, replica i binds `port + i` (vLLM offsets
  by data-parallel rank the same way), while connecting replicas all dial the one
  subscriber address; either way each has its own topic.
- Each message is three frames: the topic, an 8-byte big-endian sequence number
  (0, 1, ... per publisher), and a msgpack payload `[timestamp, [events...], dp_rank]`.
- Events are msgspec-style tagged structs with `omit_defaults`: by default maps with a
  `"type"` key (what vLLM 0.32 sends), or, with `--kv-events-format array`, positional
  arrays `[tag, field, ...]` (older vLLM and the llm-d tools). Fields without defaults
  (`lora_id`, `medium`, `lora_name`) are always present, null or not.
- One batch per engine step that produced events; none for a quiet step.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import msgpack
import zmq

from epp.sim.config import KVEventsConfig
from epp.sim.kvcache import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent

log = logging.getLogger("epp.sim")

DEFAULT_TOPIC = "kv@{host}:{port}@{model}"


def is_bind_endpoint(endpoint: str) -> bool:
    """vLLM's heuristic: bind a wildcard (or local) address, connect to anything else."""
    return (
        "*" in endpoint
        or "::" in endpoint
        or endpoint.startswith("ipc://")
        or endpoint.startswith("inproc://")
    )


def offset_endpoint_port(endpoint: str, offset: int) -> str:
    """`tcp://*:5557` + 2 -> `tcp://*:5559`; vLLM's rule for data-parallel ranks."""
    if not offset:
        return endpoint
    if endpoint.startswith("inproc://") or endpoint.startswith("ipc://"):
        return f"{endpoint}_dp{offset}"
    base, sep, port = endpoint.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"cannot offset the port of endpoint {endpoint!r}")
    return f"{base}:{int(port) + offset}"


def replica_endpoint(endpoint: str, replica: int) -> str:
    """The endpoint replica `replica` uses: its own port when binding, the shared
    subscriber address when connecting."""
    return offset_endpoint_port(endpoint, replica) if is_bind_endpoint(endpoint) else endpoint


def format_topic(template: str | None, host: str, port: int, model: str) -> str:
    """None: the empty topic (vLLM's default); empty: the llm-d convention."""
    if template is None:
        return ""
    return (template or DEFAULT_TOPIC).format(host=host, port=port, model=model)


def encode_event(event: KVEvent, fmt: str = "map") -> Any:
    if isinstance(event, BlockStored):
        fields = (
            ("block_hashes", event.block_hashes),
            ("parent_block_hash", event.parent_block_hash),
            ("token_ids", event.token_ids),
            ("block_size", event.block_size),
            ("lora_id", event.lora_id),
            ("medium", event.medium),
            ("lora_name", event.lora_name),
        )
        tag = "BlockStored"
    elif isinstance(event, BlockRemoved):
        fields = (("block_hashes", event.block_hashes), ("medium", event.medium))
        tag = "BlockRemoved"
    elif isinstance(event, AllBlocksCleared):
        fields = ()
        tag = "AllBlocksCleared"
    else:  # pragma: no cover - the cache produces only the three kinds
        raise TypeError(f"not a KV event: {event!r}")
    if fmt == "array":
        return [tag, *(value for _, value in fields)]
    return {"type": tag, **dict(fields)}


def encode_batch(ts: float, events: list[KVEvent], dp_rank: int = 0, fmt: str = "map") -> bytes:
    return msgpack.packb([ts, [encode_event(e, fmt) for e in events], dp_rank], use_bin_type=True)


class KVEventPublisher:
    """A PUB socket for one server. Sends never block: past the high-water mark a batch
    is dropped (and counted), as a PUB socket does for a slow subscriber."""

    def __init__(
        self,
        config: KVEventsConfig,
        *,
        endpoint: str,
        topic: str,
        fmt: str = "map",
        advertised_host: str = "127.0.0.1",
        dp_rank: int = 0,
    ) -> None:
        self.config = config
        self.endpoint = endpoint
        self.topic = topic
        self.fmt = fmt
        self.dp_rank = dp_rank
        self.bind = is_bind_endpoint(endpoint)
        self.advertised_host = advertised_host
        self.seq = 0
        self.sent = 0
        self.dropped = 0
        self._topic = topic.encode()
        self._socket = zmq.Context.instance().socket(zmq.PUB)
        self._socket.setsockopt(zmq.SNDHWM, config.hwm)
        self._socket.setsockopt(zmq.LINGER, 0)
        if self.bind:
            self._socket.bind(endpoint)
        else:
            self._socket.connect(endpoint)
        if config.replay_endpoint:
            log.warning("kv-events replay_endpoint is not simulated; ignoring it")

    def publish(self, events: list[KVEvent]) -> None:
        if not events:
            return
        payload = encode_batch(time.time(), events, self.dp_rank, self.fmt)
        seq = self.seq
        self.seq += 1
        try:
            self._socket.send_multipart(
                (self._topic, seq.to_bytes(8, "big"), payload), flags=zmq.NOBLOCK
            )
            self.sent += 1
        except zmq.Again:
            self.dropped += 1

    def source(self) -> dict[str, Any]:
        """This publisher as vLLM's `GET /kv_event_sources` lists it."""
        endpoint = self.endpoint.replace("*", self.advertised_host) if self.bind else self.endpoint
        return {
            "data_parallel_rank": self.dp_rank,
            "endpoint": endpoint,
            "replay_endpoint": None,
            "topic": self.topic,
        }

    def close(self) -> None:
        self._socket.close(linger=0)
