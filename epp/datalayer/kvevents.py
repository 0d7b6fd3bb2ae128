"""vLLM KV-cache events over ZMQ: the subscriber (the wire format and its decoder are in
`epp.datalayer.kv_decode`).

Garbage never raises out of this module: a bad message or event is counted in
`epp_kv_events_dropped_total{reason}` (and the subscriber's `stats`), logged once per
reason at warning level and then at debug level, and skipped.

Delivery: `KVEventSubscriber` either binds one SUB socket that every server connects to
(`mode: bind`; the server a message belongs to comes from its topic) or dials every pool
endpoint's publisher (`mode: connect`, following pool changes; what several EPP replicas
need, since each must see every event). Each socket has one reader task that decodes and
hands the batch to `on_batch` synchronously, so one server's events are applied in the
order it sent them; a jump in a server's sequence numbers is counted in
`epp_kv_events_sequence_gaps_total`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable, Sequence

import zmq
import zmq.asyncio
from prometheus_client import Counter

from epp.datalayer.kv_decode import EventBatch, Malformed, decode_frames, parse_topic
from epp.datastore import Endpoint
from epp.observability import REGISTRY

log = logging.getLogger(__name__)

KV_EVENTS_PORT_LABEL = "epp.kv-events-port"
MODES = ("bind", "connect")

EVENTS = Counter(
    "epp_kv_events",
    "KV-cache events applied, by type.",
    ["type"],
    registry=REGISTRY,
)
DROPPED = Counter(
    "epp_kv_events_dropped",
    "KV-cache event messages or events skipped, by reason.",
    ["reason"],
    registry=REGISTRY,
)
SEQUENCE_GAPS = Counter(
    "epp_kv_events_sequence_gaps",
    "Jumps in a server's KV-event sequence numbers (lost or reordered messages).",
    registry=REGISTRY,
)


# ---- the subscriber ---------------------------------------------------------------
BatchHandler = Callable[[str, str, EventBatch], None]


def _no_endpoints() -> list[Endpoint]:
    return []


def _no_subscription(fn: Callable[[], None]) -> Callable[[], None]:
    return lambda: None


class KVEventSubscriber:
    """Receives vLLM KV events and hands each batch to `on_batch(endpoint, model, batch)`.

    `pool()` / `on_pool_change(fn)` describe the endpoints (the plugin Handle's). In
    bind mode they map a topic's `host:port` (or an endpoint name) to the endpoint; in
    connect mode they say whom to dial: `tcp://<address>:<port>` with the port from the
    endpoint's `epp.kv-events-port` label, else `publisher_port`.
    `handle_frames` is the whole receive path without sockets (tests use it directly).
    """

    def __init__(
        self,
        on_batch: BatchHandler,
        *,
        mode: str = "bind",
        endpoint: str = "tcp://*:5557",
        publisher_port: int = 5557,
        topic_filter: str = "kv@",
        pool: Callable[[], list[Endpoint]] = _no_endpoints,
        on_pool_change: Callable[[Callable[[], None]], Callable[[], None]] = _no_subscription,
        receive_hwm: int = 10_000,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
        self.on_batch = on_batch
        self.mode = mode
        self.endpoint = endpoint
        self.publisher_port = publisher_port
        self.topic_filter = topic_filter
        self.pool = pool
        self.on_pool_change = on_pool_change
        self.receive_hwm = receive_hwm
        self.stats: collections.Counter[str] = collections.Counter()
        self.bound_endpoint: str | None = None
        self._pods: dict[str, str] = {}
        # (endpoint, data-parallel rank) → last sequence number: each rank publishes its own.
        self._last_seq: dict[tuple[str, int | None], int] = {}
        self._warned: set[str] = set()
        self._ctx: zmq.asyncio.Context | None = None
        # key (endpoint name, or "" for the bound socket) → (address, socket, reader task)
        self._conns: dict[str, tuple[str, zmq.asyncio.Socket, asyncio.Task[None]]] = {}
        self._dying: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._running = False

    # ---- lifecycle --------------------------------------------------------
    async def start(self) -> None:
        if self._running:
            return
        self._loop = asyncio.get_running_loop()
        self._ctx = zmq.asyncio.Context()
        self._running = True
        self._unsubscribe = self.on_pool_change(self._pool_changed)
        self._refresh_pods()
        try:
            if self.mode == "bind":
                sock = self._socket()
                sock.bind(self.endpoint)
                self.bound_endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
                self._spawn("", self.bound_endpoint, sock)
                log.info("KV events: listening on %s", self.bound_endpoint)
            else:
                self._sync_connections()
        except Exception:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Cancel every reader, close every socket and the context; nothing is left."""
        self._running = False
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        conns = list(self._conns.values())
        self._conns.clear()
        tasks = [t for _, _, t in conns] + list(self._dying)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._dying.clear()
        for _, sock, _ in conns:
            sock.close(linger=0)
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
            self._ctx = None

    @property
    def running(self) -> bool:
        return self._running

    def connections(self) -> dict[str, str]:
        """Live sockets: endpoint name (or "" for the bound one) → address."""
        return {k: addr for k, (addr, _, t) in self._conns.items() if not t.done()}

    def open_tasks(self) -> int:
        return sum(not t.done() for _, _, t in self._conns.values()) + len(self._dying)

    # ---- sockets ----------------------------------------------------------
    def _socket(self) -> zmq.asyncio.Socket:
        assert self._ctx is not None
        sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, self.receive_hwm)
        sock.setsockopt(zmq.SUBSCRIBE, self.topic_filter.encode())
        return sock

    def _spawn(self, key: str, address: str, sock: zmq.asyncio.Socket) -> None:
        assert self._loop is not None
        task = self._loop.create_task(self._read(key or None, sock), name=f"kv-events:{key}")
        # Closes the socket even if the task is cancelled before it ever ran.
        task.add_done_callback(lambda _t, s=sock: s.close(linger=0))
        self._conns[key] = (address, sock, task)

    async def _read(self, endpoint: str | None, sock: zmq.asyncio.Socket) -> None:
        while True:
            try:
                frames = await sock.recv_multipart(copy=True)
            except zmq.ZMQError as e:
                if self._running:
                    log.warning("KV events: socket error on %s: %s", endpoint or "bind", e)
                return
            self.handle_frames(frames, endpoint)

    def publisher_address(self, ep: Endpoint) -> str | None:
        raw = ep.labels.get(KV_EVENTS_PORT_LABEL)
        port = self.publisher_port
        if raw is not None:
            try:
                port = int(raw)
            except ValueError:
                port = 0
            if not 0 < port < 65536:
                self._drop("bad_port_label", f"{ep.name}: {KV_EVENTS_PORT_LABEL}={raw!r}")
                return None
        host = f"[{ep.address}]" if ":" in ep.address else ep.address
        return f"tcp://{host}:{port}"

    def _sync_connections(self) -> None:
        """Connect mode: one SUB socket per pool endpoint's publisher, and no others."""
        if not self._running or self.mode != "connect":
            return
        want: dict[str, str] = {}
        for ep in self.pool():
            addr = self.publisher_address(ep)
            if addr is not None:
                want[ep.name] = addr
        for name, (addr, _, task) in list(self._conns.items()):
            if want.get(name) != addr:
                del self._conns[name]
                task.cancel()
                self._dying.add(task)
                task.add_done_callback(self._dying.discard)
                self._forget_seq(name)
        for name, addr in want.items():
            if name not in self._conns:
                sock = self._socket()
                if addr.startswith("tcp://["):
                    sock.setsockopt(zmq.IPV6, 1)
                sock.connect(addr)
                self._spawn(name, addr, sock)

    # ---- following the pool -----------------------------------------------
    def _pool_changed(self) -> None:
        # Called on our loop: the datastore hands cross-thread changes to it.
        if self._running and self._loop is not None:
            self._resync()

    def _resync(self) -> None:
        self._refresh_pods()
        self._sync_connections()

    def _refresh_pods(self) -> None:
        pods: dict[str, str] = {}
        for ep in self.pool():
            pods[ep.name] = ep.name
            pods[ep.hostport] = ep.name
        self._pods = pods
        for key in [k for k in self._last_seq if k[0] not in pods]:
            del self._last_seq[key]

    def _forget_seq(self, name: str) -> None:
        for key in [k for k in self._last_seq if k[0] == name]:
            del self._last_seq[key]

    # ---- the receive path -----------------------------------------------------
    def handle_frames(self, frames: Sequence[bytes], endpoint: str | None = None) -> bool:
        """Decode one message and hand it on; False (counted, logged) if it was dropped.

        `endpoint` is the socket's endpoint in connect mode; in bind mode (None) the
        topic's `host:port` names it.
        """
        try:
            topic, seq, batch = decode_frames(frames)
            pod, model = parse_topic(topic)
        except Malformed as m:
            self._drop(m.reason, str(m))
            return False
        name = endpoint or self._pods.get(pod)
        if name is None:
            self._drop("unknown_endpoint", f"topic {topic!r} names no pool endpoint")
            return False
        key = (name, batch.data_parallel_rank)
        last = self._last_seq.get(key)
        if last is not None and seq != last + 1:
            self.stats["sequence_gaps"] += 1
            SEQUENCE_GAPS.inc()
            log.debug("KV events: %s sequence %d after %d", name, seq, last)
        self._last_seq[key] = seq
        for reason in batch.skipped:
            self._drop(reason, f"an event from {name}")
        try:
            self.on_batch(name, model, batch)
        except Exception as e:  # a handler bug must not kill the reader
            self._drop("handler_error", f"{name}: {e!r}")
            return False
        self.stats["messages"] += 1
        for ev in batch.events:
            EVENTS.labels(type=type(ev).__name__).inc()
        return True

    def _drop(self, reason: str, detail: str) -> None:
        self.stats[f"dropped:{reason}"] += 1
        DROPPED.labels(reason=reason).inc()
        if reason not in self._warned:
            self._warned.add(reason)
            log.warning(
                "KV events: dropped (%s): %s (further ones logged at debug)", reason, detail
            )
        else:
            log.debug("KV events: dropped (%s): %s", reason, detail)
