"""The gRPC side: the ext_proc servicer and the health service.

One `RequestStream` per `Process` call; whatever way the stream ends (end of response,
Envoy closing it, cancellation) its `close()` runs and in-flight counts are given back
(exactly once: the end of the response usually gave them back already).
The servicer owns what spans streams: the server-wide body budget, the body deadline
(a request not complete within `body_timeout` gets 408), and draining (on SIGTERM new
streams are refused while open ones finish).

With `routes` (`--response-path observer`) a stream whose first message has
`observability_mode` set is Envoy's observer filter's: it goes to an `ObserverStream`
(epp/extproc/observer.py), which joins the routed request by its route id; the servicer
also runs the `RouteTable`'s sweep (a timer armed only while legs wait to be claimed).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc
from envoy.service.accesslog.v3 import als_pb2_grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from epp.body_budget import BodyShares
from epp.completion import ResponseObserver
from epp.datastore import Datastore
from epp.director import Director
from epp.extproc.access_log import AccessLogServicer
from epp.extproc.cert_reload import CertReloader
from epp.extproc.handoff import RouteTable
from epp.extproc.observer import ObserverStream
from epp.extproc.stream import Phase, RequestStream
from epp.extproc.tls import ServerCert, server_credentials
from epp.limits import BodyBudget, BodyLimits, HeaderLimits

if TYPE_CHECKING:
    from epp.tracing import RequestTracer

log = logging.getLogger("epp.extproc")

EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
DEFAULT_MAX_BUFFERED_BYTES = 256 * 1024 * 1024
DEFAULT_BODY_TIMEOUT = 30.0

_UNROUTED = (Phase.AWAIT_HEADERS, Phase.GATHER_BODY)


@dataclass(frozen=True)
class StreamLimits:
    """Everything that bounds one stream and all of them together (epp/limits.py)."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_buffered_bytes: int = DEFAULT_MAX_BUFFERED_BYTES
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    body: BodyLimits = field(default_factory=BodyLimits)
    headers: HeaderLimits = field(default_factory=HeaderLimits)
    shares: BodyShares = field(default_factory=BodyShares)

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {self.max_body_bytes}")
        if not self.body_timeout > 0:
            raise ValueError(f"body_timeout must be > 0 seconds, got {self.body_timeout}")


class _BodyDeadline:
    """One stream's body deadline (`body_timeout` from its start): one timer per stream,
    armed on the first wait for a message and kept until the request is routed, instead
    of an `asyncio.timeout_at` (a Timeout object and a TimerHandle) around every message
    wait. When it fires while the stream waits for a message, that wait is cancelled and
    raises TimeoutError, as `asyncio.timeout_at` did; a wait that starts after it fired
    raises TimeoutError at once.

    With a minimum body data rate (`min_rate` bytes/s after `grace` seconds, Kestrel's
    MinRequestBodyDataRate), the deadline is also the moment the body's average rate
    since the stream's start would fall below it if nothing more came:
    start + grace + received / min_rate. Bytes received move it later; the timer is not
    re-armed per chunk: when it fires early it re-arms itself at the moved deadline."""

    __slots__ = (
        "_at",
        "_cancelling",
        "_due_at",
        "_expired",
        "_handle",
        "_loop",
        "_rate",
        "_received",
        "_start",
        "_task",
        "_waiting",
        "slow",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        seconds: float,
        received: Callable[[], int] | None = None,
        min_rate: float = 0.0,
        grace: float = 0.0,
    ) -> None:
        self._loop = loop
        now = loop.time()
        self._at = now + seconds
        self._received = received if min_rate > 0 else None
        self._rate = min_rate
        self._start = now + grace
        self.slow = False  # the rate deadline fired, not the body timeout
        self._due_at = self._at if self._received is None else min(self._at, self._start)
        self._handle: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[object] | None = None
        self._waiting = False
        self._expired = False
        self._cancelling = 0

    # A wait in three calls, inlined in the servicer's loop (no coroutine per message):
    # begin() before the wait, fired() on CancelledError (True: the timer's, raise
    # TimeoutError), end() after it however it went.
    def _due(self) -> float:
        if self._received is None:
            return self._at
        return min(self._at, self._start + self._received() / self._rate)

    def begin(self) -> None:
        """Start a wait; raises TimeoutError if the deadline has passed."""
        # `_due_at` is a lower bound (bytes only move the deadline later): recomputed only
        # when it has passed, so a wait usually costs one comparison, as before the rate.
        if self._expired or self._loop.time() >= self._due_at:
            self._due_at = self._due()
            if self._expired or self._loop.time() >= self._due_at:
                self._expire()
                raise TimeoutError
        if self._handle is None:
            self._task = asyncio.current_task()
            self._handle = self._loop.call_at(self._due_at, self._fire)
        if self._task is not None:
            self._cancelling = self._task.cancelling()
        self._waiting = True

    def fired(self) -> bool:
        """The wait was cancelled by this deadline (and nobody else also cancelled the
        task: asyncio.Timeout's own test)."""
        task = self._task
        return self._expired and task is not None and task.uncancel() <= self._cancelling

    def end(self) -> None:
        self._waiting = False

    def _expire(self) -> None:
        if not self._expired:
            self._expired = True
            self.slow = self._loop.time() < self._at

    def _fire(self) -> None:
        self._handle = None
        due = self._due_at = self._due()
        if self._loop.time() < due:  # bytes came meanwhile: the rate deadline moved on
            self._handle = self._loop.call_at(due, self._fire)
            return
        self._expire()
        if self._waiting and self._task is not None:
            self._task.cancel()

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


class ExtProcServicer(pb_grpc.ExternalProcessorServicer):
    def __init__(
        self,
        director: Director,
        limits: StreamLimits | None = None,
        observer: ResponseObserver | None = None,
        routes: RouteTable | None = None,
        tracer: RequestTracer | None = None,
    ) -> None:
        if routes is not None and observer is None:
            raise ValueError("the observer mode (routes) needs the response observer")
        self.director = director
        self.limits = limits or StreamLimits()
        self.max_body_bytes = self.limits.max_body_bytes
        self.observer = observer
        self.budget = BodyBudget(self.limits.max_buffered_bytes, self.limits.shares)
        self.open_streams = 0
        self.draining = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._warned_no_response = False
        self.routes = routes
        self.tracer = tracer  # epp/tracing.py; None: tracing off
        self._sweep_timer: asyncio.TimerHandle | None = None
        self._warned: set[str] = set()

    async def Process(
        self,
        request_iterator: AsyncIterator[pb.ProcessingRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.ProcessingResponse]:
        if self.draining:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the endpoint picker is draining")
        lim = self.limits
        stream = RequestStream(
            self.director,
            lim.max_body_bytes,
            self.observer,
            body_limits=lim.body,
            header_limits=lim.headers,
            budget=self.budget,
            routes=self.routes,
            tracer=self.tracer,
        )
        self.open_streams += 1
        self._idle.clear()
        shares = lim.shares
        deadline = _BodyDeadline(
            asyncio.get_running_loop(),
            lim.body_timeout,
            lambda: stream.body_bytes,
            shares.min_rate,
            shares.rate_grace,
        )
        messages = aiter(request_iterator)
        first = True
        try:
            while True:
                try:
                    if stream.phase in _UNROUTED:  # begin / fired / end: see _BodyDeadline
                        deadline.begin()
                        try:
                            msg = await anext(messages)
                        except asyncio.CancelledError:
                            if deadline.fired():
                                raise TimeoutError from None
                            raise
                        finally:
                            deadline.end()
                    elif stream.running is None:  # the common case: cannot be evicted
                        deadline.cancel()
                        msg = await anext(messages)
                    else:  # a sheddable request under flowControl.enableEviction
                        deadline.cancel()
                        if stream.evicted:
                            break  # evicted while we were answering: see below
                        # The evictor wakes this wait (RequestStream.evict): see below.
                        task = stream.waiter = asyncio.current_task()
                        cancelling = task.cancelling() if task is not None else 0
                        try:
                            msg = await anext(messages)
                        except asyncio.CancelledError:
                            # Ours only if nobody else also cancelled (asyncio.Timeout's test).
                            if not stream.evicted or task is None or task.uncancel() > cancelling:
                                raise
                            break
                        finally:
                            stream.waiter = None
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    if deadline.slow:
                        out = stream.body_too_slow(shares.min_rate, shares.rate_grace)
                    else:
                        out = stream.body_timed_out(lim.body_timeout)
                    for resp in out:
                        yield resp
                    break
                if first:
                    first = False
                    if msg.observability_mode:  # Envoy's observer filter: nothing to answer
                        deadline.cancel()
                        await self._observe(msg, messages)
                        break
                if stream.needs_async(msg):
                    responses = await stream.handle_async(msg)
                else:  # the common case: no coroutine per message
                    responses = stream.handle(msg)
                for resp in responses:
                    yield resp
                self._ensure_sweep()
            if stream.evicted:
                for resp in stream.eviction_responses():
                    yield resp
            self._check_response_phases(stream)
        finally:
            deadline.cancel()
            self.open_streams -= 1
            if not self.open_streams:
                self._idle.set()
            stream.close()
            # Also here: Envoy may reset the stream while this generator waits at a
            # `yield` after the routing answer (the response phases skipped), and then the
            # check in the loop never runs; a parked leg without a timer would never expire.
            self._ensure_sweep()

    async def _observe(
        self, first: pb.ProcessingRequest, messages: AsyncIterator[pb.ProcessingRequest]
    ) -> None:
        """An observability-mode stream to its end (Envoy ignores any answer)."""
        if self.routes is None or self.routes.claimant != "observer":
            self._warn_once(
                "observer",
                "Envoy sends an observability-mode ext_proc stream, but this EPP does not "
                "run --response-path observer: ignored (its responses go unmeasured)",
            )
            async for _ in messages:
                pass
            return
        obs = ObserverStream(self.routes)
        try:
            msg: pb.ProcessingRequest | None = first
            while msg is not None:
                try:
                    if not obs.handle(msg):
                        break  # nothing more to observe: end the stream (observer.py)
                except Exception:  # a bug loses this measurement, never the server
                    log.exception("observing a response failed; the rest goes unobserved")
                    break  # close() below gives its hold back (incomplete), never leaked
                msg = await anext(messages, None)
        finally:
            obs.close()
        if self.routes.foreign:
            self._warn_once(
                "foreign",
                "an observer stream carries another EPP replica's route id: with several "
                "EPPs behind one ext_proc cluster use the in-path response "
                "(deploy/envoy/envoy-replicas.yaml, --response-path on)",
            )

    def _ensure_sweep(self) -> None:
        """Arm the sweep when legs are parked and no timer is pending."""
        if self.routes is not None and self._sweep_timer is None and len(self.routes):
            self._arm_sweep(self.routes.join_timeout)

    def _arm_sweep(self, delay: float) -> None:
        loop = asyncio.get_running_loop()
        self._sweep_timer = loop.call_later(max(delay, 0.0), self._sweep)

    def _sweep(self) -> None:
        """End the parked legs nobody claimed within the join timeout (handoff.py)."""
        self._sweep_timer = None
        assert self.routes is not None
        expired = self.routes.expired
        next_at = self.routes.sweep()
        if self.routes.expired > expired:
            self._warn_once("expired", _EXPIRED_HINT[self.routes.claimant](self.routes))
        if next_at is not None:
            self._arm_sweep(next_at - time.monotonic())

    def _warn_once(self, key: str, text: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(text)

    async def drain(self, grace: float) -> bool:
        """Refuse new streams; wait up to `grace` seconds for open ones. True if all ended."""
        self.draining = True
        try:
            await asyncio.wait_for(self._idle.wait(), grace)
        except TimeoutError:
            return False
        return True

    def _check_response_phases(self, stream: RequestStream) -> None:
        """Envoy closed a routed stream without sending its response: its config skips
        the response phases, so in-flight counts end at routing. Say so once."""
        if self.observer is None or self._warned_no_response or stream.phase is not Phase.ROUTED:
            return
        if self.routes is not None:  # observer mode: the response comes on another stream
            return
        self._warned_no_response = True
        log.warning(
            "the response path is on but Envoy sent no response phases: in-flight counts "
            "end at routing and no response is measured. Set the ext_proc processing_mode "
            "response_header_mode SEND, response_body_mode FULL_DUPLEX_STREAMED, "
            "response_trailer_mode SEND (deploy/envoy/envoy-inpath.yaml), or run with "
            "--response-path log behind Envoy's access log (deploy/envoy/envoy.yaml), or "
            "--response-path off"
        )


_EXPIRED_HINT = {
    "observer": lambda r: (
        f"a routed request's observer stream did not come within {r.join_timeout:g}s; its "
        "in-flight counts were given back. Envoy needs the observer filter of "
        "deploy/envoy/envoy-observer.yaml"
    ),
    "log": lambda r: (
        f"a routed request's access-log entry did not come within {r.join_timeout:g}s "
        "(--response-log-timeout); its in-flight counts were given back. " + _log_cause(r)
    ),
}


class HealthReporter:
    """SERVING for the ext_proc service (and "") once the pool has endpoints, until
    `drain()` (then NOT_SERVING for good, so Envoy stops sending new streams)."""

    def __init__(self, datastore: Datastore) -> None:
        self.servicer = health.aio.HealthServicer()
        self.datastore = datastore
        self.draining = False

    async def refresh(self) -> None:
        serving = len(self.datastore) and not self.draining
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for service in ("", EXT_PROC_SERVICE):
            await self.servicer.set(service, status)

    async def drain(self) -> None:
        self.draining = True
        await self.refresh()


async def start_grpc_servers(
    director: Director,
    datastore: Datastore,
    host: str,
    grpc_port: int,
    health_port: int,
    max_body_bytes: int | None = None,
    observer: ResponseObserver | None = None,
    limits: StreamLimits | None = None,
    tls: ServerCert | None = None,
    routes: RouteTable | None = None,
    tracer: RequestTracer | None = None,
) -> tuple[grpc.aio.Server, grpc.aio.Server, ExtProcServicer, HealthReporter, int, int]:
    """Start the ext_proc server (also answering health) and the separate health server.

    Returns the servers, the servicer, the health reporter and the bound ports (port 0
    picks a free one). Give `limits`, or only `max_body_bytes` (the rest default). With
    `tls` the ext_proc port serves TLS; the health port stays plaintext (epp/extproc/tls.py).
    `routes`: `--response-path observer` (epp/extproc/handoff.py).
    """
    if limits is not None and max_body_bytes is not None:
        raise ValueError("give max_body_bytes inside limits, not both")
    if limits is None:
        limits = StreamLimits(max_body_bytes=max_body_bytes or DEFAULT_MAX_BODY_BYTES)
    health_reporter = HealthReporter(datastore)
    servicer = ExtProcServicer(director, limits, observer, routes, tracer)
    options = [
        ("grpc.max_receive_message_length", limits.max_body_bytes + 1024 * 1024),
        ("grpc.max_send_message_length", limits.max_body_bytes + 1024 * 1024),
        ("grpc.so_reuseport", 0),
    ]
    main = grpc.aio.server(options=options)
    pb_grpc.add_ExternalProcessorServicer_to_server(servicer, main)
    if routes is not None and routes.claimant == "log":
        als_pb2_grpc.add_AccessLogServiceServicer_to_server(AccessLogServicer(routes), main)
    health_pb2_grpc.add_HealthServicer_to_server(health_reporter.servicer, main)
    if tls is not None:
        if tls.reload_dir is not None:  # new handshakes get the files' current certificate
            creds = CertReloader(tls.reload_dir, tls).credentials()
        else:
            creds = server_credentials(tls)
        bound_grpc = main.add_secure_port(f"{host}:{grpc_port}", creds)
    else:
        bound_grpc = main.add_insecure_port(f"{host}:{grpc_port}")
    health_server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    health_pb2_grpc.add_HealthServicer_to_server(health_reporter.servicer, health_server)
    bound_health = health_server.add_insecure_port(f"{host}:{health_port}")
    if not bound_grpc or not bound_health:
        raise OSError(f"could not bind gRPC ports {host}:{grpc_port} / {host}:{health_port}")
    await health_reporter.refresh()
    await main.start()
    await health_server.start()
    return main, health_server, servicer, health_reporter, bound_grpc, bound_health


def _log_cause(r: RouteTable) -> str:
    """What most likely kept the entries away, from what this EPP's entries were."""
    if r.foreign:
        return (
            f"{r.foreign} entries named another EPP replica's requests: give each replica "
            "its own access logger (deploy/envoy/envoy-replicas.yaml), or, behind one "
            "Kubernetes Service where Envoy cannot, run the replicas with --response-path on"
        )
    if not (r.claimed or r.unknown):
        return (
            "No access-log entry has reached this EPP: Envoy needs the access log and the "
            "Lua filter of deploy/envoy/envoy.yaml, sent to this replica (several replicas "
            "behind one Kubernetes Service share one log stream: run them with "
            "--response-path on)"
        )
    return (
        "Envoy needs the access log and the Lua filter of deploy/envoy/envoy.yaml; entries "
        "are lost with a broken log stream or an Envoy restart"
    )
