"""Every endpoint's polling on one `selectors` loop, without asyncio: the scraper that
`ScraperThread` runs for `http` endpoints.

Why not `MetricsScraper` on an asyncio loop in the thread (what ran before): per scrape
it paid a task wake-up, a future, an `asyncio.timeout` (a TimerHandle), a sleep (another
TimerHandle) and the transport's callbacks; py-spy of `bench/scrape_cpu.py` put 44 % of
the thread's CPU in asyncio's machinery, 15 % in the HTTP client, 34 % in parsing
(docs/BENCHMARKS.md@a73a134 "Request-path cost"). Here a scrape is a `send`, the `epoll_wait`
that was going to happen anyway, one or two `recv`s, and the parse: the selector's
timeout is the next due scrape or deadline, both kept in heaps.

Same behaviour as `MetricsScraper`, which stays the scraper for `https` (TLS over
non-blocking sockets is not done here) and for tools that run a scraper on their loop:
one kept-alive HTTP/1.1 connection per endpoint and poll (`/metrics`, `/v1/models`), read
by `httpget.ResponseReader` (the same framing, head and page limits); a reused
connection that the server closed while idle is retried once on a new one; the per-scrape
`timeout`, with "inconclusive" when the datastore's clock (the request loop's
`LoopClock`) says the EPP itself was stalled; failures logged on change
only, under the `epp.datalayer.scraper` logger; the adaptive interval (`next_interval`,
`load_state`); results through a `ScrapeSink`; the pool followed through
`Datastore.on_change` (the callback only sets a flag and wakes the selector).

A host name that is not an IP address is resolved off this thread (a one-worker
executor), so a slow DNS answer delays only that endpoint's scrape.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import heapq
import ipaddress
import json
import logging
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from epp.datalayer import promtext
from epp.datalayer.httpget import (
    BodyTooLarge,
    ConnectError,
    ProtocolError,
    Response,
    ResponseReader,
    request_bytes,
)
from epp.datalayer.metric_maps import (
    EngineMap,
    MetricsExtractError,
    engine_for,
    extract,
    get_engine,
)
from epp.datalayer.scraper import (
    INCONCLUSIVE,
    SCRAPE_HEADERS,
    ScrapeConfig,
    ScrapeSink,
    failure_reason,
    load_state,
    next_interval,
    record_scrape_outcome,
)
from epp.datastore import Datastore, Endpoint, EndpointMetrics

__all__ = ["SelectorScraper"]

# The scraper's messages keep the logger operators know (the asyncio scraper's).
log = logging.getLogger("epp.datalayer.scraper")

# Under glibc's mmap threshold: `recv` allocates this much per call, then shrinks it.
_RECV_BYTES = 64 * 1024
_IN_PROGRESS = (errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EAGAIN)
_METRICS, _MODELS = "metrics", "models"


@dataclass(eq=False, slots=True)
class _Job:
    """One poll of one endpoint (its `/metrics` or its `/v1/models`): its schedule, its
    kept-alive connection and the request in flight on it."""

    ep: Endpoint
    kind: str
    raw: bytes  # the GET request
    emap: EngineMap | None = None
    alive: bool = True
    sock: socket.socket | None = None
    registered: int = 0  # the selector events asked for (0: not registered)
    reader: ResponseReader | None = None  # a request in flight
    out: bytes = b""  # request bytes not yet sent
    reused: bool = False  # in flight on a kept-alive connection: a close may mean stale
    resolving: bool = False
    attempt: int = 0  # bumped per request; a deadline of an older attempt is void
    started: float = 0.0  # the datastore's clock at the request's start
    next_at: float = 0.0  # monotonic
    interval: float = 0.0
    state: tuple[object, ...] | None = None  # load_state of the last scrape
    models_failed: bool = False


class SelectorScraper:
    """The polling loop; `run()` is the thread's body, `stop()` (any thread) ends it.

    Attributes read by tests and the status of `ScraperThread`: `failing()`,
    `served_models`, `intervals`, `open_connections`, `running`.
    """

    def __init__(self, datastore: Datastore, config: ScrapeConfig, sink: ScrapeSink) -> None:
        if config.scheme != "http":
            raise ValueError("SelectorScraper speaks plain http; https uses MetricsScraper")
        self.datastore = datastore
        self.config = config
        self.sink = sink
        self.served_models: dict[str, frozenset[str]] = {}
        self.intervals: dict[str, float] = {}
        self._failing: dict[str, str] = {}
        self._bugs: set[str] = set()  # endpoints whose unexpected error was logged
        self._latest: dict[str, EndpointMetrics] = {}
        self._jobs: dict[str, list[_Job]] = {}
        self._due: list[tuple[float, int, _Job]] = []  # (monotonic, seq, job)
        self._deadlines: list[tuple[float, int, _Job, int]] = []  # (monotonic, seq, job, attempt)
        self._seq = 0
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._changed = True  # the first pass builds the jobs
        self._stopping = False
        self._resolved: list[tuple[_Job, int, object]] = []  # (job, attempt, addr or error)
        self._resolver: concurrent.futures.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()  # guards _resolved only
        self._unsubscribe: Callable[[], None] | None = datastore.on_change(self._on_change)
        self.running = False

    # ---- any thread ---------------------------------------------------------
    def stop(self) -> None:
        """Ask `run()` to end (it closes every connection on its way out)."""
        self._stopping = True
        self._wake()

    def failing(self) -> dict[str, str]:
        return dict(self._failing)

    @property
    def open_connections(self) -> int:
        return sum(1 for jobs in self._jobs.values() for j in jobs if j.sock is not None)

    def _on_change(self) -> None:
        self._changed = True
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # a full pipe is woken already; closed: stopped
            self._wake_w.send(b"\0")

    # ---- the loop -------------------------------------------------------------
    def run(self) -> None:
        self.running = True
        try:
            while not self._stopping:
                if self._changed:
                    self._changed = False
                    self._sync()
                self._take_resolved()
                now = time.monotonic()
                self._expire(now)
                self._start_due(now)
                timeout = self._next_wake() - time.monotonic()
                for key, mask in self._sel.select(max(0.0, timeout)):
                    job = key.data
                    if job is None:
                        self._drain_wake()
                    else:
                        self._guarded(self._ready, job, mask)
        finally:
            self.running = False
            self._close_all()

    def _guarded(self, step: Callable[..., None], job: _Job, arg: object) -> None:
        """A bug in one endpoint's step fails that scrape (and is logged), never the
        thread: a dead scraper thread would make the whole pool stale."""
        try:
            step(job, arg)
        except Exception as e:
            if job.ep.name not in self._bugs:  # once per endpoint: 20 scrapes a second
                self._bugs.add(job.ep.name)
                log.exception("scraper error on %s (logged once)", job.ep.name)
            try:
                self._fail(job, e)  # records it and schedules the next scrape
            except Exception:
                self._close(job)
                job.reader, job.resolving = None, False
                if job.alive:
                    self._push_due(job, time.monotonic() + self.config.interval)

    def _next_wake(self) -> float:
        t = self._due[0][0] if self._due else time.monotonic() + 1.0
        dl = self._deadlines
        # Deadlines of requests that ended are dropped here, not woken up for: nearly
        # every request ends well before its deadline.
        while dl and not _pending(dl[0][2], dl[0][3]):
            heapq.heappop(dl)
        if dl and dl[0][0] < t:
            t = dl[0][0]
        return t

    def _drain_wake(self) -> None:
        with contextlib.suppress(OSError):  # BlockingIOError: drained
            while self._wake_r.recv(4096):
                pass

    def _push_due(self, job: _Job, at: float) -> None:
        job.next_at = at
        self._seq += 1
        heapq.heappush(self._due, (at, self._seq, job))

    def _start_due(self, now: float) -> None:
        due = self._due
        while due and due[0][0] <= now:
            _, _, job = heapq.heappop(due)
            if job.alive and job.reader is None and not job.resolving:
                self._guarded(self._begin, job, now)

    def _expire(self, now: float) -> None:
        dl = self._deadlines
        while dl and dl[0][0] <= now:
            _, _, job, attempt = heapq.heappop(dl)
            if _pending(job, attempt):
                self._close(job)
                job.resolving = False
                job.reader = None
                self._done(job, None, TimeoutError())

    # ---- following the pool ---------------------------------------------------
    def _sync(self) -> None:
        current = {ep.name: ep for ep in self.datastore.endpoints()}
        for name, jobs in list(self._jobs.items()):
            if current.get(name) != jobs[0].ep:
                del self._jobs[name]
                for job in jobs:
                    job.alive = False
                    self._close(job)
                self._failing.pop(name, None)
                self.intervals.pop(name, None)
                self.served_models.pop(name, None)
                self._latest.pop(name, None)
        now = time.monotonic()
        cfg = self.config
        for name, ep in current.items():
            if name in self._jobs:
                continue
            try:
                emap = get_engine(
                    engine_for(ep, cfg.default_engine, cfg.engine_label_keys), cfg.engines
                )
            except MetricsExtractError as e:
                self._record(ep, str(e))
                self._jobs[name] = [_Job(ep, _METRICS, b"", alive=False)]
                continue
            metrics = _Job(
                ep, _METRICS, request_bytes(ep.address, ep.port, cfg.path, SCRAPE_HEADERS), emap
            )
            metrics.interval = cfg.interval
            metrics.state = load_state(self._previous(ep))
            jobs = [metrics]
            if cfg.models_interval > 0:
                jobs.append(_Job(ep, _MODELS, request_bytes(ep.address, ep.port, cfg.models_path)))
            self._jobs[name] = jobs
            for job in jobs:
                self._push_due(job, now)

    # ---- one request ----------------------------------------------------------
    def _begin(self, job: _Job, now: float) -> None:
        job.attempt += 1
        job.started = self.datastore.clock()
        self._seq += 1
        heapq.heappush(self._deadlines, (now + self.config.timeout, self._seq, job, job.attempt))
        job.reader = ResponseReader(self.config.max_page_bytes)
        if job.sock is not None:
            job.reused = True
            self._send(job, job.raw)
        else:
            self._connect(job)

    def _connect(self, job: _Job) -> None:
        job.reused = False
        host, port = job.ep.address, job.ep.port
        try:
            family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
        except ValueError:  # a name: resolve off this thread
            self._resolve(job)
            return
        self._open(job, family, (host, port))

    def _resolve(self, job: _Job) -> None:
        if self._resolver is None:
            self._resolver = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="epp-scraper-dns"
            )
        job.resolving = True
        job.reader = None
        attempt = job.attempt
        host, port = job.ep.address, job.ep.port

        def done(fut: concurrent.futures.Future[list]) -> None:
            try:
                infos = fut.result()
                result: object = (infos[0][0], infos[0][4])
            except BaseException as e:  # any failure is the endpoint's
                result = e
            with self._lock:
                self._resolved.append((job, attempt, result))
            self._wake()

        fut = self._resolver.submit(socket.getaddrinfo, host, port, 0, socket.SOCK_STREAM)
        fut.add_done_callback(done)

    def _take_resolved(self) -> None:
        if not self._resolved:
            return
        with self._lock:
            batch, self._resolved = self._resolved, []
        for job, attempt, result in batch:
            if not job.alive or job.attempt != attempt or not job.resolving:
                continue  # timed out or left the pool meanwhile
            job.resolving = False
            job.reader = ResponseReader(self.config.max_page_bytes)
            if isinstance(result, BaseException):
                os_err = result if isinstance(result, OSError) else OSError(str(result))
                self._fail(job, ConnectError(os_err))
            else:
                family, addr = result  # type: ignore[misc]
                self._open(job, family, addr)

    def _open(self, job: _Job, family: int, addr: object) -> None:
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as e:
            self._fail(job, ConnectError(e))
            return
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        job.sock = sock
        err = sock.connect_ex(addr)  # type: ignore[arg-type]
        if err == 0:
            self._send(job, job.raw)
        elif err in _IN_PROGRESS:
            job.out = job.raw
            self._want(job, selectors.EVENT_WRITE)
        else:
            self._fail(job, ConnectError(OSError(err, _strerror(err))))

    def _send(self, job: _Job, data: bytes) -> None:
        assert job.sock is not None
        try:
            sent = job.sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError as e:
            self._lost(job, e)
            return
        job.out = data[sent:]
        self._want(job, selectors.EVENT_READ | (selectors.EVENT_WRITE if job.out else 0))

    def _want(self, job: _Job, events: int) -> None:
        if job.registered == events:
            return
        assert job.sock is not None
        if job.registered:
            self._sel.modify(job.sock, events, job)
        else:
            self._sel.register(job.sock, events, job)
        job.registered = events

    def _ready(self, job: _Job, mask: int) -> None:
        sock = job.sock
        if sock is None or not job.alive:
            return
        if mask & selectors.EVENT_WRITE:
            if job.registered == selectors.EVENT_WRITE:  # connecting
                err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    self._fail(job, ConnectError(OSError(err, _strerror(err))))
                    return
            self._send(job, job.out)
            if job.sock is not sock:  # closed, or replaced by a retry's new connection
                return
        if mask & selectors.EVENT_READ:
            try:
                data = sock.recv(_RECV_BYTES)
            except BlockingIOError:
                return
            except OSError as e:
                self._lost(job, e)
                return
            if job.reader is None:
                # Readable while idle: the server closed the kept-alive connection (or
                # sent bytes nobody asked for): never reuse it.
                self._close(job)
                return
            if not data:
                self._lost(job, None)
                return
            try:
                response = job.reader.feed(data)
            except (ProtocolError, BodyTooLarge) as e:
                self._fail(job, e)
                return
            if response is not None:
                if not job.reader.keep_alive:
                    self._close(job)
                job.reader = None
                self._done(job, response, None)

    def _lost(self, job: _Job, exc: OSError | None) -> None:
        """The connection ended (or broke) with a request in flight."""
        reader = job.reader
        self._close(job)
        if reader is None:
            return
        response = reader.eof() if exc is None else None
        if response is not None:
            job.reader = None
            self._done(job, response, None)
            return
        if job.reused and not reader.got_bytes:
            # The server closed the idle connection as we sent: once more on a new one
            # (a GET is idempotent), within the same deadline.
            job.reader = ResponseReader(self.config.max_page_bytes)
            self._connect(job)
            return
        error = ProtocolError("connection closed by the server before a full response")
        error.__cause__ = exc
        self._fail(job, error)

    def _fail(self, job: _Job, error: BaseException) -> None:
        self._close(job)
        job.reader = None
        self._done(job, None, error)

    def _close(self, job: _Job) -> None:
        sock = job.sock
        if sock is None:
            return
        job.sock = None
        job.out = b""
        if job.registered:
            self._sel.unregister(sock)
            job.registered = 0
        sock.close()

    def _close_all(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        for jobs in self._jobs.values():
            for job in jobs:
                job.alive = False
                self._close(job)
        self._sel.close()
        self._wake_r.close()
        self._wake_w.close()
        if self._resolver is not None:
            # A resolution in progress cannot be interrupted; its worker ends with it.
            self._resolver.shutdown(wait=False, cancel_futures=True)

    # ---- results ----------------------------------------------------------------
    def _done(self, job: _Job, response: Response | None, error: BaseException | None) -> None:
        if not job.alive:
            return
        if job.kind == _METRICS:
            self._metrics_done(job, response, error)
        else:
            self._models_done(job, response, error)

    def _metrics_done(
        self, job: _Job, response: Response | None, exc: BaseException | None
    ) -> None:
        ep, cfg = job.ep, self.config
        error: str | None = None
        if exc is not None:
            if isinstance(exc, TimeoutError) and (
                self.datastore.clock() - job.started < cfg.timeout
            ):
                error = INCONCLUSIVE
            else:
                error = failure_reason(exc, cfg.timeout)
        elif response is not None and response.status != 200:
            error = f"HTTP {response.status}"
        elif response is not None:
            error = self._read_page(job, response.body)
        if error != INCONCLUSIVE:
            self._record(ep, error)
        if not job.alive:
            return
        new_state = load_state(self._previous(ep))
        job.interval = next_interval(
            job.interval,
            error is not None or new_state != job.state,
            cfg.interval,
            cfg.max_interval,
        )
        job.state = new_state
        self.intervals[ep.name] = job.interval
        now = time.monotonic()
        # A slow scrape: start the next one now, don't burst.
        self._push_due(job, max(job.next_at + job.interval, now))

    def _read_page(self, job: _Job, body: bytes) -> str | None:
        ep = job.ep
        assert job.emap is not None
        try:
            samples = promtext.parse(body, job.emap.families)
            metrics = extract(
                job.emap, samples, self.datastore.clock(), previous=self._previous(ep)
            )
        except MetricsExtractError as e:
            return str(e)
        except Exception as e:  # any failure is a failed scrape, never a dead thread
            log.debug("unexpected scrape error for %s", ep.name, exc_info=True)
            return failure_reason(e, self.config.timeout)
        if self._current(ep):
            self._latest[ep.name] = metrics
            self.sink.metrics(ep, metrics)
        return None

    def _models_done(self, job: _Job, response: Response | None, exc: BaseException | None) -> None:
        ep = job.ep
        models: frozenset[str] | None = None
        if exc is None and response is not None:
            try:
                models = _models(response, self.config.models_path)
            except Exception as e:
                exc = e
        if models is not None:
            job.models_failed = False
            if self._current(ep) and self.served_models.get(ep.name) != models:
                self.served_models[ep.name] = models
                self.sink.models(ep, models)
        else:
            if not job.models_failed:
                log.info(
                    "models of %s unavailable: %s",
                    ep.name,
                    failure_reason(exc or ProtocolError("no response"), self.config.timeout),
                )
            job.models_failed = True
        if job.alive:
            self._push_due(job, time.monotonic() + self.config.models_interval)

    def _current(self, ep: Endpoint) -> bool:
        return self.datastore.get(ep.name) == ep

    def _previous(self, ep: Endpoint) -> EndpointMetrics | None:
        latest = self._latest.get(ep.name)
        return latest if latest is not None else self.datastore.metrics(ep.name)

    def _record(self, ep: Endpoint, error: str | None) -> None:
        record_scrape_outcome(self._failing, ep, error, self.sink if self._current(ep) else None)


def _pending(job: _Job, attempt: int) -> bool:
    """`job`'s request number `attempt` is still under way (connecting, resolving, sent)."""
    return job.alive and job.attempt == attempt and (job.reader is not None or job.resolving)


def _models(response: Response, path: str) -> frozenset[str]:
    """The model ids of a `/v1/models` reply (as `MetricsScraper.fetch_models`)."""
    if response.status != 200:
        raise ValueError(f"HTTP {response.status} from {path}")
    payload = json.loads(response.body)
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list):
        raise ValueError("no 'data' list in the /v1/models reply")
    return frozenset(m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str))


def _strerror(err: int) -> str:
    return os.strerror(err)
