"""Speculative prefix entries shared between EPP replicas (active-active precise routing).

Why: with K replicas behind Envoy each HTTP request reaches any of them. The precise index
is the same in all of them (each subscribes to every server's KV events), but the
speculative entries ("this request was just routed to X; its blocks will be there") were
per replica: until X's `BlockStored` events arrive (after its prefill, so up to a queue
wait plus a prefill at load) a follow-up that reaches another replica sees no prefix
anywhere and lands elsewhere. docs/BENCHMARKS.md@a73a134 "EPP replicas" measured the loss (precise
index, many-groups: 45.5 % hit rate with one EPP, 30.5 % with two). Here each replica
publishes every speculative entry it adds and applies the others', so the window in which
replicas disagree shrinks from a prefill to one loopback/LAN message.

Upstream has no such channel: GIE stays active-passive because of per-replica state
(GIE#692, #1406; a CRDT + memberlist proposal, PR GIE#1851, was closed); llm-d-router#1892
asks to replicate the approximate index and in-flight counts over ZMQ (open). Envoy
cannot pin a prefix group to one EPP instead: its hash policies read headers, and the
prefix is in the body, which only the ext_proc server sees (reference: routing-results.md
§3). This shares the one piece the precise index lacks across replicas.

Wire (ZMQ, the transport the KV events already use): each replica binds one PUB socket
(`speculativeSyncBind`, e.g. `tcp://*:5558`) and one SUB socket dials every peer in
`speculativeSyncPeers` (`tcp://HOST:PORT`; a host name is resolved to ALL its addresses
every `RESOLVE_INTERVAL_S`, so a headless Service name reaches every EPP pod as pods come
and go). A message is two frames: `b"spec"` and msgpack `[1, sender, endpoint, ttl,
hashes]` with `sender` 16 random bytes per process (a replica that lists itself, as a
headless Service does, drops its own messages), `ttl` in seconds (the receiver's clock
starts it on arrival), `hashes` the block hashes as little-endian uint64s. Endpoint names
must be the same in every replica (they are when all read the same pool source).

Loss is harmless: PUB drops when a peer is slow or not yet connected; a lost entry is a
missed early hint and the servers' KV events still arrive. Garbage is counted and
skipped, never raised.
"""

from __future__ import annotations

import asyncio
import collections
import ipaddress
import logging
import os
import re
import socket
import sys
from array import array
from collections.abc import Callable, Sequence

import msgpack
import zmq
import zmq.asyncio
from prometheus_client import Counter

from epp.observability import REGISTRY

log = logging.getLogger(__name__)

TOPIC = b"spec"
VERSION = 1
RESOLVE_INTERVAL_S = 10.0
_PEER = re.compile(r"^tcp://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")
_BIND = re.compile(r"^tcp://(\*|\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")
_U64 = "Q"

MESSAGES = Counter(
    "epp_prefix_spec_sync_messages",
    "Speculative prefix entries shared with peer EPP replicas, by outcome "
    "(sent, applied, own, dropped).",
    ["outcome"],
    registry=REGISTRY,
)

EntryHandler = Callable[[str, Sequence[int], float], None]


def parse_peer(text: str, field: str = "speculativeSyncPeers") -> tuple[str, int]:
    """`tcp://host:port` → (host, port); ValueError naming the field and the form."""
    m = _PEER.match(text)
    if m is None or not 0 < int(m.group(2)) < 65536:
        raise ValueError(f"{field}: {text!r} is not tcp://HOST:PORT (PORT 1-65535)")
    return m.group(1).strip("[]"), int(m.group(2))


def check_bind(text: str, field: str = "speculativeSyncBind") -> None:
    m = _BIND.match(text)
    if m is None or not 0 <= int(m.group(2)) < 65536:
        raise ValueError(f"{field}: {text!r} is not tcp://ADDRESS:PORT (e.g. tcp://*:5558)")


def encode(sender: bytes, endpoint: str, hashes: Sequence[int], ttl: float) -> bytes:
    arr = array(_U64, hashes)
    if sys.byteorder == "big":
        arr.byteswap()
    return msgpack.packb([VERSION, sender, endpoint, float(ttl), arr.tobytes()])


def decode(payload: bytes) -> tuple[bytes, str, list[int], float]:
    """(sender, endpoint, hashes, ttl); ValueError for anything else."""
    try:
        raw = msgpack.unpackb(payload)
    except Exception as e:
        raise ValueError(f"not msgpack: {e}") from None
    if not isinstance(raw, list) or len(raw) != 5 or raw[0] != VERSION:
        raise ValueError("not a version-1 entry")
    _, sender, endpoint, ttl, blob = raw
    if not isinstance(sender, bytes) or not isinstance(endpoint, str) or not endpoint:
        raise ValueError("bad sender or endpoint")
    if not isinstance(ttl, float | int) or not 0 < ttl <= 3600:
        raise ValueError(f"bad ttl {ttl!r}")
    if not isinstance(blob, bytes) or len(blob) % 8:
        raise ValueError("hashes are not uint64s")
    arr = array(_U64)
    arr.frombytes(blob)
    if sys.byteorder == "big":
        arr.byteswap()
    return sender, endpoint, arr.tolist(), float(ttl)


def _address(host: str, port: int) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


class SpecSync:
    """One replica's side: `publish` what it routed, `on_entry` what its peers routed."""

    def __init__(
        self,
        bind: str,
        peers: Sequence[str],
        on_entry: EntryHandler,
        *,
        resolve_interval: float = RESOLVE_INTERVAL_S,
        hwm: int = 10_000,
    ) -> None:
        check_bind(bind)
        self.bind = bind
        self.peers = [parse_peer(p) for p in peers]
        self.on_entry = on_entry
        self.resolve_interval = resolve_interval
        self.hwm = hwm
        self.sender = os.urandom(16)
        self.stats: collections.Counter[str] = collections.Counter()
        self.bound_endpoint: str | None = None
        self._pub_ctx: zmq.Context | None = None
        self._pub: zmq.Socket | None = None
        self._ctx: zmq.asyncio.Context | None = None
        self._sub: zmq.asyncio.Socket | None = None
        self._connected: set[str] = set()
        self._resolved: dict[tuple[str, int], set[str]] = {}  # peer → its addresses
        self._tasks: list[asyncio.Task[None]] = []
        self._warned = False

    # ---- lifecycle --------------------------------------------------------
    async def start(self) -> None:
        if self._sub is not None:
            return
        try:
            # PUB from a plain context: `send` with NOBLOCK never waits (PUB drops at HWM).
            self._pub_ctx = zmq.Context()
            self._pub = self._pub_ctx.socket(zmq.PUB)
            self._pub.setsockopt(zmq.LINGER, 0)
            self._pub.setsockopt(zmq.SNDHWM, self.hwm)
            if self.bind.startswith("tcp://["):
                self._pub.setsockopt(zmq.IPV6, 1)
            self._pub.bind(self.bind)
            self.bound_endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
            self._ctx = zmq.asyncio.Context()
            self._sub = self._ctx.socket(zmq.SUB)
            self._sub.setsockopt(zmq.LINGER, 0)
            self._sub.setsockopt(zmq.RCVHWM, self.hwm)
            self._sub.setsockopt(zmq.IPV6, 1)
            self._sub.setsockopt(zmq.SUBSCRIBE, TOPIC)
            await self.resolve_once()
        except Exception:
            await self.stop()
            raise
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._read(), name="spec-sync:read")]
        if self.resolve_interval > 0:
            self._tasks.append(loop.create_task(self._resolve_loop(), name="spec-sync:resolve"))
        log.info(
            "speculative prefix sync: publishing on %s, peers %s",
            self.bound_endpoint,
            ", ".join(sorted(self._connected)) or "none resolved yet",
        )

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        for sock in (self._sub, self._pub):
            if sock is not None:
                sock.close(linger=0)
        self._sub = self._pub = None
        for ctx in (self._ctx, self._pub_ctx):
            if ctx is not None:
                ctx.destroy(linger=0)
        self._ctx = self._pub_ctx = None
        self._connected.clear()
        self._resolved.clear()

    def connections(self) -> set[str]:
        return set(self._connected)

    # ---- peers --------------------------------------------------------------
    async def resolve_once(self) -> None:
        """Dial every address of every peer; hang up on addresses that went away."""
        if self._sub is None:
            return
        loop = asyncio.get_running_loop()
        for host, port in self.peers:
            try:
                ipaddress.ip_address(host)
                addrs = {host}
            except ValueError:
                try:
                    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
                except OSError as e:  # keep its last addresses rather than drop live peers
                    log.warning("speculative prefix sync: cannot resolve %s: %s", host, e)
                    continue
                addrs = {str(info[4][0]) for info in infos}
            self._resolved[(host, port)] = {_address(a, port) for a in addrs}
        want = set().union(*self._resolved.values())
        for addr in self._connected - want:
            self._sub.disconnect(addr)
        for addr in want - self._connected:
            self._sub.connect(addr)
        self._connected = want

    async def _resolve_loop(self) -> None:
        while True:
            await asyncio.sleep(self.resolve_interval)
            await self.resolve_once()

    # ---- the two directions -------------------------------------------------
    def publish(self, endpoint: str, hashes: Sequence[int], ttl: float) -> None:
        """Tell the peers: `endpoint` will hold `hashes` (never blocks, never raises)."""
        if self._pub is None or not hashes:
            return
        try:
            self._pub.send_multipart(
                [TOPIC, encode(self.sender, endpoint, hashes, ttl)], flags=zmq.NOBLOCK
            )
        except (zmq.ZMQError, OverflowError, ValueError) as e:
            self._count("dropped")
            log.debug("speculative prefix sync: not sent: %s", e)
            return
        self._count("sent")

    async def _read(self) -> None:
        assert self._sub is not None
        while True:
            try:
                frames = await self._sub.recv_multipart()
            except zmq.ZMQError as e:
                log.warning("speculative prefix sync: socket error: %s", e)
                return
            self.handle_frames(frames)

    def handle_frames(self, frames: Sequence[bytes]) -> bool:
        """Apply one message; False (counted) if it was our own or garbage."""
        try:
            if len(frames) != 2 or frames[0] != TOPIC:
                raise ValueError(f"{len(frames)} frames")
            sender, endpoint, hashes, ttl = decode(frames[1])
        except ValueError as e:
            self._count("dropped")
            if not self._warned:
                self._warned = True
                log.warning("speculative prefix sync: dropped a message: %s", e)
            return False
        if sender == self.sender:
            self._count("own")
            return False
        try:
            self.on_entry(endpoint, hashes, ttl)
        except Exception as e:  # a handler bug must not kill the reader
            self._count("dropped")
            log.warning("speculative prefix sync: handler failed: %r", e)
            return False
        self._count("applied")
        return True

    def _count(self, outcome: str) -> None:
        self.stats[outcome] += 1
        MESSAGES.labels(outcome=outcome).inc()
