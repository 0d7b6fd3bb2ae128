"""Background polling of every endpoint's `/metrics` (and `/v1/models`) into the datastore.

One asyncio task per endpoint, as upstream runs one collector goroutine per endpoint:
a slow or dead server then delays only its own scrapes. Each task polls every
`interval` (50 ms by default, upstream's `--refresh-metrics-interval`) with a
`timeout` per scrape (1 s), parses only the families its engine map needs, and
writes an `EndpointMetrics` stamped with the datastore's clock, so health
(`Datastore.is_healthy`) is judged on the same clock as staleness.

Failures (connection refused, timeout, HTTP status, a page without the engine's
metrics) mark the endpoint failed with a short reason. They are logged only when an
endpoint starts failing and when it recovers: at 20 scrapes a second, one line per
failure would flood the log.

Adaptive interval (`max_interval` > `interval`, off by default): an endpoint whose scraped
state (queue, running, KV usage, adapters) did not change since its last scrape is
scraped half as often each time, up to `max_interval`; any change or failure goes back to
`interval` at once. The EPP's own in-flight counts are the fast load signal (updated at
pick, first token and end of every request it routes), so an idle server need not answer
20 scrapes a second; a busy one is still read at the fast rate (docs/BENCHMARKS.md@a73a134,
"Scrape interval").

The scraper follows the pool: it listens to `Datastore.on_change` and starts tasks
for new endpoints and cancels those of removed (or re-addressed) ones.

Where results go: a `ScrapeSink`. By default the datastore itself, written on the loop
the scraper runs on (tests, tools). `epp serve` runs the scraper on its own thread
(`epp/datalayer/scrape_thread.py`) with a sink that hands results to the request loop
in batches, so no scrape, parse or timer runs on the loop that serves ext_proc.
The HTTP client is `epp/datalayer/httpget.py` (keep-alive, one Protocol per connection).
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from types import TracebackType
from typing import Any, Protocol

from epp.datalayer import promtext
from epp.datalayer.httpget import BodyTooLarge, ConnectError, HttpGetClient, ProtocolError
from epp.datalayer.metric_maps import (
    DEFAULT_ENGINE,
    ENGINE_LABEL_KEYS,
    ENGINES,
    EngineMap,
    MetricsExtractError,
    engine_for,
    extract,
    get_engine,
)
from epp.datastore import Datastore, Endpoint, EndpointMetrics

__all__ = ["DatastoreSink", "MetricsScraper", "ScrapeConfig", "ScrapeSink"]

log = logging.getLogger(__name__)

# Ask for the classic text format, uncompressed: OpenMetrics adds exemplars after the
# value, and gzip costs both sides CPU for a page that crosses a cluster network.
SCRAPE_HEADERS = {"Accept": "text/plain;version=0.0.4", "Accept-Encoding": "identity"}

# Upstream `metrics-data-source` parameter names → ScrapeConfig fields.
_PARAM_NAMES = {
    "scheme": "scheme",
    "path": "path",
    "insecureSkipVerify": "insecure_skip_verify",
}


@dataclass(frozen=True, slots=True)
class ScrapeConfig:
    """How to reach and read each endpoint (defaults equal upstream's).

    `scheme`, `path`, `insecure_skip_verify` are the `metrics-data-source` plugin
    parameters; `default_engine` and `engine_label_keys` those of the
    `core-metrics-extractor` (`defaultEngine`, `engineLabelKey`). A `models_interval`
    of 0 turns off the `/v1/models` poll.
    """

    interval: float = 0.05
    max_interval: float = 0.0  # > interval: adaptive (see the module doc); 0: fixed
    timeout: float = 1.0
    scheme: str = "http"
    path: str = "/metrics"
    insecure_skip_verify: bool = True
    models_interval: float = 5.0
    models_path: str = "/v1/models"
    # A /metrics page larger than this is a failed scrape, read no further: a broken or
    # hostile server must not make the EPP buffer and parse gigabytes on its loop. vLLM's
    # page is ~20-60 KB (more with per-LoRA series); 16 MiB leaves 300x headroom.
    max_page_bytes: int = 16 * 1024 * 1024
    default_engine: str = DEFAULT_ENGINE
    engine_label_keys: tuple[str, ...] = ENGINE_LABEL_KEYS
    engines: Mapping[str, EngineMap] = field(default_factory=lambda: dict(ENGINES))

    def __post_init__(self) -> None:
        if self.scheme not in ("http", "https"):
            raise ValueError(f"scheme must be 'http' or 'https', got {self.scheme!r}")
        for name in ("path", "models_path"):
            value = getattr(self, name)
            if not value.startswith("/"):
                raise ValueError(f"{name} must start with '/', got {value!r}")
        if not self.interval > 0:
            raise ValueError(f"interval must be > 0 seconds, got {self.interval!r}")
        if self.max_interval and self.max_interval < self.interval:
            raise ValueError(
                f"max_interval must be 0 (fixed) or >= interval ({self.interval:g}),"
                f" got {self.max_interval!r}"
            )
        if not self.timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {self.timeout!r}")
        if self.max_page_bytes < 1:
            raise ValueError(f"max_page_bytes must be >= 1, got {self.max_page_bytes!r}")
        if self.models_interval < 0:
            raise ValueError(f"models_interval must be >= 0, got {self.models_interval!r}")
        get_engine(self.default_engine, self.engines)  # unknown default: fail at start-up

    @classmethod
    def from_params(cls, params: Mapping[str, Any] | None, **overrides: Any) -> ScrapeConfig:
        """From upstream `metrics-data-source` parameters (`scheme`, `path`,
        `insecureSkipVerify`); unknown names are refused."""
        kwargs: dict[str, Any] = {}
        for key, value in (params or {}).items():
            if key not in _PARAM_NAMES:
                raise ValueError(
                    f"unknown metrics-data-source parameter {key!r};"
                    f" known: {', '.join(_PARAM_NAMES)}"
                )
            kwargs[_PARAM_NAMES[key]] = value
        kwargs.update(overrides)
        return cls(**kwargs)


_CONFIG_FIELDS = frozenset(f.name for f in fields(ScrapeConfig))

# A scrape that timed out although the datastore's clock (a LoopClock in `epp serve`)
# says it had less than `timeout` of loop time: the EPP was stalled, not the endpoint.
# Such an attempt neither marks the endpoint failed nor updates it.
INCONCLUSIVE = "inconclusive: the EPP's own event loop stalled during the scrape"


def next_interval(current: float, changed: bool, lo: float, hi: float) -> float:
    """The adaptive schedule: back to `lo` on a change, else double up to `hi` (`hi` <= `lo`
    means a fixed interval)."""
    if changed or hi <= lo:
        return lo
    return min(hi, current * 2)


def load_state(m: EndpointMetrics | None) -> tuple[object, ...] | None:
    """What counts as an endpoint's state changing (the scrape's stamp does not)."""
    if m is None:
        return None
    return (
        m.waiting_queue_size,
        m.running_requests,
        m.kv_cache_usage,
        m.active_models,
        m.waiting_models,
    )


def failure_reason(exc: BaseException, timeout: float) -> str:
    """A short, stable failure reason (stable so transition logging works)."""
    if isinstance(exc, TimeoutError):
        return f"timeout after {timeout:g}s"
    if isinstance(exc, ConnectError):
        os_err = exc.os_error
        if isinstance(os_err, ConnectionRefusedError):
            return "connection refused"
        return f"cannot connect: {getattr(os_err, 'strerror', None) or os_err}"
    if isinstance(exc, BodyTooLarge):
        if exc.announced is not None:
            return f"metrics page of {exc.announced} bytes exceeds {exc.limit}"
        return f"metrics page exceeds {exc.limit} bytes"
    if isinstance(exc, ProtocolError | OSError):
        return f"{type(exc).__name__}: {exc}"[:200]
    return f"internal error: {type(exc).__name__}: {exc}"[:200]


class ScrapeSink(Protocol):
    """Where scrape results go. `ep` is the endpoint as scraped: a result for an endpoint
    that has since left the pool or changed address must be dropped."""

    def metrics(self, ep: Endpoint, metrics: EndpointMetrics) -> None: ...

    def failed(self, ep: Endpoint, error: str) -> None: ...

    def models(self, ep: Endpoint, models: frozenset[str]) -> None: ...


class DatastoreSink:
    """Results written straight into the datastore: only from the datastore's own loop."""

    def __init__(self, datastore: Datastore) -> None:
        self.datastore = datastore

    def metrics(self, ep: Endpoint, metrics: EndpointMetrics) -> None:
        if self.datastore.get(ep.name) == ep:
            self.datastore.update_metrics(ep.name, metrics)

    def failed(self, ep: Endpoint, error: str) -> None:
        if self.datastore.get(ep.name) == ep:
            self.datastore.mark_scrape_failed(ep.name, error)

    def models(self, ep: Endpoint, models: frozenset[str]) -> None:
        if self.datastore.get(ep.name) != ep:
            return
        setter = getattr(self.datastore, "set_models", None)  # once the datastore has it
        if callable(setter):
            try:
                setter(ep.name, models)
            except Exception:
                log.warning("datastore.set_models(%r) failed", ep.name, exc_info=True)


class MetricsScraper:
    """Keeps the datastore's metrics fresh by polling every endpoint.

    Use as `async with MetricsScraper(ds, interval=0.05): ...`, or `start()` inside
    a running loop and `await stop()`. Keyword overrides are `ScrapeConfig` fields.
    `served_models[name]` holds the model ids the endpoint's `/v1/models` lists.
    `sink` receives the results (default: the datastore, on this loop); the datastore
    is otherwise only read (its endpoints, its clock), which any thread may do.
    """

    def __init__(
        self,
        datastore: Datastore,
        config: ScrapeConfig | None = None,
        *,
        sink: ScrapeSink | None = None,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        **overrides: Any,
    ) -> None:
        """`clock` (default: the loop's) and `sleep` pace the polling; tests inject both."""
        unknown = set(overrides) - _CONFIG_FIELDS
        if unknown:
            raise TypeError(f"unknown scraper option(s): {', '.join(sorted(unknown))}")
        self.datastore = datastore
        self.config = replace(config or ScrapeConfig(), **overrides)
        self.sink: ScrapeSink = sink or DatastoreSink(datastore)
        self.served_models: dict[str, frozenset[str]] = {}
        self._client: HttpGetClient | None = None
        self._tasks: dict[str, tuple[Endpoint, asyncio.Task[None]]] = {}
        self._dying: set[asyncio.Task[None]] = set()
        self._failing: dict[str, str] = {}
        # The last good metrics per endpoint, as this scraper read them (the sink may
        # apply them later, on another thread): the adaptive rule and `extract` compare
        # against these.
        self._latest: dict[str, EndpointMetrics] = {}
        self._clock = clock
        self._sleep = sleep
        # The interval each endpoint is polled at now (adaptive mode changes it).
        self.intervals: dict[str, float] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running = False
        self._unsubscribe: Callable[[], None] | None = None
        cfg = self.config
        self._headers = {**SCRAPE_HEADERS}
        self._ssl_context: ssl.SSLContext | None = None
        if cfg.scheme == "https":
            ctx = ssl.create_default_context()
            if cfg.insecure_skip_verify:  # upstream's insecureSkipVerify, default on
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            self._ssl_context = ctx

    # ---- lifecycle --------------------------------------------------------
    def start(self) -> None:
        """Start polling every current endpoint; must run inside the event loop."""
        if self._running:
            return
        self._loop = asyncio.get_running_loop()
        self._client = HttpGetClient(self._ssl_context)
        self._running = True
        if self._unsubscribe is None:
            self._unsubscribe = self.datastore.on_change(self._on_change)
        self._sync()

    async def stop(self) -> None:
        """Cancel every task, wait for them, close every connection."""
        self._running = False
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        tasks = [t for _, t in self._tasks.values()] + list(self._dying)
        self._tasks.clear()
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._dying.clear()
        if self._client is not None:
            self._client.close()

    async def __aenter__(self) -> MetricsScraper:
        self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def running(self) -> bool:
        return self._running

    @property
    def client(self) -> HttpGetClient | None:
        return self._client

    def task_names(self) -> list[str]:
        """Endpoints with a live polling task (for tests and debug pages)."""
        return [name for name, (_, t) in self._tasks.items() if not t.done()]

    def failing(self) -> dict[str, str]:
        """Endpoints whose last scrape failed, with the reason."""
        return dict(self._failing)

    # ---- following the pool -----------------------------------------------
    def _on_change(self) -> None:
        # The datastore calls this on our loop (it subscribed from there).
        self._sync()

    def _sync(self) -> None:
        """Make the set of tasks match the datastore's endpoints."""
        if not self._running or self._loop is None:
            return
        current = {ep.name: ep for ep in self.datastore.endpoints()}
        for name, (ep, task) in list(self._tasks.items()):
            if current.get(name) != ep:
                del self._tasks[name]
                task.cancel()
                self._dying.add(task)
                task.add_done_callback(self._dying.discard)
                self._failing.pop(name, None)
                self.intervals.pop(name, None)
                self.served_models.pop(name, None)
                self._latest.pop(name, None)
                if self._client is not None and ep.hostport not in {
                    e.hostport for e in current.values()
                }:
                    self._client.forget(ep.address, ep.port)
        for name, ep in current.items():
            if name not in self._tasks:
                task = self._loop.create_task(self._run(ep), name=f"epp-scrape:{name}")
                self._tasks[name] = (ep, task)

    # ---- per endpoint -----------------------------------------------------
    def _current(self, ep: Endpoint) -> bool:
        return self.datastore.get(ep.name) == ep

    def _url(self, ep: Endpoint, path: str) -> str:
        return f"{self.config.scheme}://{ep.hostport}{path}"

    def _path(self, ep: Endpoint, path: str) -> str:
        """The request target for `path` on `ep` (the path of `_url`, which tests may
        replace to route endpoints to paths of one server)."""
        url = self._url(ep, path)
        rest = url.split("://", 1)[-1]
        slash = rest.find("/")
        return rest[slash:] if slash >= 0 else "/"

    async def _run(self, ep: Endpoint) -> None:
        try:
            emap = get_engine(
                engine_for(ep, self.config.default_engine, self.config.engine_label_keys),
                self.config.engines,
            )
        except MetricsExtractError as e:
            self._record(ep, str(e))
            return
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._metrics_loop(ep, emap))
            if self.config.models_interval > 0:
                tg.create_task(self._models_loop(ep))

    async def _metrics_loop(self, ep: Endpoint, emap: EngineMap) -> None:
        clock = self._clock or asyncio.get_running_loop().time
        path = self._path(ep, self.config.path)
        lo, hi = self.config.interval, self.config.max_interval
        interval = lo
        state = load_state(self._previous(ep))
        next_at = clock()
        while True:
            error = await self.scrape_once(ep, emap, path)
            if error != INCONCLUSIVE:
                self._record(ep, error)
            new_state = load_state(self._previous(ep))
            interval = next_interval(interval, error is not None or new_state != state, lo, hi)
            state = new_state
            self.intervals[ep.name] = interval
            next_at += interval
            now = clock()
            if next_at < now:  # a slow scrape: start the next one now, don't burst
                next_at = now
            await self._sleep(next_at - now)

    def _previous(self, ep: Endpoint) -> EndpointMetrics | None:
        """The endpoint's last good metrics: this scraper's, else the datastore's."""
        latest = self._latest.get(ep.name)
        return latest if latest is not None else self.datastore.metrics(ep.name)

    async def scrape_once(
        self, ep: Endpoint, emap: EngineMap | None = None, path: str | None = None
    ) -> str | None:
        """Scrape one endpoint once and hand the result on; return the failure or None."""
        if emap is None:
            emap = get_engine(
                engine_for(ep, self.config.default_engine, self.config.engine_label_keys),
                self.config.engines,
            )
        client = self._client
        if client is None:
            return "scraper not started"
        cfg = self.config
        started = self.datastore.clock()
        try:
            async with asyncio.timeout(cfg.timeout):
                resp = await client.get(
                    ep.address,
                    ep.port,
                    path or self._path(ep, cfg.path),
                    headers=self._headers,
                    max_bytes=cfg.max_page_bytes,
                )
            if resp.status != 200:
                return f"HTTP {resp.status}"
            samples = promtext.parse(resp.body, emap.families)
            metrics = extract(emap, samples, self.datastore.clock(), previous=self._previous(ep))
        except asyncio.CancelledError:
            raise
        except MetricsExtractError as e:
            return str(e)
        except TimeoutError as e:
            if self.datastore.clock() - started < cfg.timeout:
                return INCONCLUSIVE
            return failure_reason(e, cfg.timeout)
        except Exception as e:  # any failure is a failed scrape, never a dead task
            if not isinstance(e, ProtocolError | BodyTooLarge | OSError):
                log.debug("unexpected scrape error for %s", ep.name, exc_info=True)
            return failure_reason(e, cfg.timeout)
        if self._current(ep):
            self._latest[ep.name] = metrics
            self.sink.metrics(ep, metrics)
        return None

    def _record(self, ep: Endpoint, error: str | None) -> None:
        record_scrape_outcome(self._failing, ep, error, self.sink if self._current(ep) else None)

    async def _models_loop(self, ep: Endpoint) -> None:
        path = self._path(ep, self.config.models_path)
        failed = False
        while True:
            try:
                models = await self.fetch_models(ep, path)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if not failed:
                    log.info(
                        "models of %s unavailable: %s",
                        ep.name,
                        failure_reason(e, self.config.timeout),
                    )
                failed = True
            else:
                failed = False
                self._set_models(ep, models)
            await asyncio.sleep(self.config.models_interval)

    async def fetch_models(self, ep: Endpoint, path: str | None = None) -> frozenset[str]:
        """The model ids an OpenAI-compatible server lists at `/v1/models` (raises on error)."""
        if self._client is None:
            raise RuntimeError("scraper not started")
        async with asyncio.timeout(self.config.timeout):
            resp = await self._client.get(
                ep.address,
                ep.port,
                path or self._path(ep, self.config.models_path),
                max_bytes=self.config.max_page_bytes,
            )
        if resp.status != 200:
            raise ValueError(f"HTTP {resp.status} from {self.config.models_path}")
        payload = json.loads(resp.body)
        data = payload.get("data") if isinstance(payload, dict) else None
        if not isinstance(data, list):
            raise ValueError("no 'data' list in the /v1/models reply")
        return frozenset(
            m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)
        )

    def _set_models(self, ep: Endpoint, models: frozenset[str]) -> None:
        if not self._current(ep) or self.served_models.get(ep.name) == models:
            return
        self.served_models[ep.name] = models
        self.sink.models(ep, models)


def record_scrape_outcome(
    failing: dict[str, str], ep: Endpoint, error: str | None, sink: ScrapeSink | None
) -> None:
    """Shared by both scrapers: mark a failure through `sink` (None when the endpoint
    has left the pool) and log only on a change of state, so a dead endpoint scraped
    every 50 ms writes two lines, not twenty a second."""
    previous = failing.get(ep.name)
    if error is None:
        if previous is not None:
            del failing[ep.name]
            log.info("metrics of %s (%s) recovered", ep.name, ep.hostport)
        return
    if sink is not None:
        sink.failed(ep, error)
    failing[ep.name] = error
    if previous is None:
        log.warning(
            "metrics of %s (%s) unavailable: %s (logged again on recovery)",
            ep.name,
            ep.hostport,
            error,
        )
