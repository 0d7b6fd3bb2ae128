"""The scraper on its own thread, so no scrape, parse or scrape timer runs on the loop
that serves ext_proc.

`ScraperThread` owns one thread. For `http` endpoints (every shipped shape) it runs a
`SelectorScraper` there: every endpoint's polling on one `selectors` loop, no asyncio
(`epp/datalayer/selector_scraper.py` says why). For `https` it runs a `MetricsScraper`
on an asyncio loop of its own (TLS over non-blocking sockets is asyncio's). Results
come back through a `HandoverSink`: appended to a list under a lock, and applied to the
datastore on the datastore's own loop, by whichever comes first: the next
`Datastore.snapshot()` (its inbox: a scheduling cycle sees every result that arrived
before it) or a poll every `interval` (so an idle EPP's health stays current). So every
datastore write still happens on the request loop, between scheduling cycles: a
snapshot never sees half a scrape, and the scheduler reads without a lock. Why not one
`call_soon_threadsafe` per result: the wake-up (a write to the loop's self-pipe, the
loop's read) was ~30 % of the scraper's CPU per scrape (py-spy, `bench/scrape_cpu.py`).

Staleness keeps working: the scraper stamps each scrape with the datastore's clock, the
request loop's `LoopClock` (thread-safe `now()`), which stands still while that loop is
stalled; a stall that holds the GIL (a huge body parsed on the loop) stalls this thread
too, so its scrapes time out "inconclusive" and the pool does not look dead. A busy
request loop no longer delays scrapes at all: this thread waits at most Python's GIL
switch interval (5 ms) to run.

Shutdown: `stop()` stops the scraper (connections closed), ends the thread and joins
it; results still in flight are dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable

from epp.datalayer.scraper import DatastoreSink, MetricsScraper, ScrapeConfig
from epp.datalayer.selector_scraper import SelectorScraper
from epp.datastore import Datastore, Endpoint, EndpointMetrics

__all__ = ["HandoverSink", "ScraperThread"]

log = logging.getLogger(__name__)

THREAD_NAME = "epp-scraper"
_START_TIMEOUT = 10.0


class HandoverSink:
    """Scrape results from any thread, applied in arrival order on `loop`'s thread by
    `drain()` (the datastore's inbox and a poll every `interval`; see the module doc)."""

    def __init__(
        self, target: DatastoreSink, loop: asyncio.AbstractEventLoop, interval: float = 0.05
    ) -> None:
        self.target = target
        self.loop = loop
        self.interval = interval
        self._lock = threading.Lock()
        self._pending: list[tuple[Callable[[Endpoint, object], None], Endpoint, object]] = []
        self._closed = False
        self._owner: int | None = None  # the loop's thread
        self._poll: asyncio.Task[None] | None = None
        self._remove_inbox: Callable[[], None] | None = None
        self.batches = 0  # drains that applied something (for tests and the benchmark)
        self.applied = 0  # results applied

    def start(self) -> None:
        """On `loop`: become the datastore's inbox and start the poll."""
        self._owner = threading.get_ident()
        self._remove_inbox = self.target.datastore.add_inbox(self.drain)
        self._poll = self.loop.create_task(self._poll_forever(), name="epp-scrape-handover")

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.drain()

    def metrics(self, ep: Endpoint, metrics: EndpointMetrics) -> None:
        self._put(self.target.metrics, ep, metrics)  # type: ignore[arg-type]

    def failed(self, ep: Endpoint, error: str) -> None:
        self._put(self.target.failed, ep, error)  # type: ignore[arg-type]

    def models(self, ep: Endpoint, models: frozenset[str]) -> None:
        self._put(self.target.models, ep, models)  # type: ignore[arg-type]

    def _put(self, apply: Callable[[Endpoint, object], None], ep: Endpoint, value: object) -> None:
        with self._lock:
            if not self._closed:
                self._pending.append((apply, ep, value))

    def drain(self) -> None:
        """Apply every pending result, in arrival order; only on the loop's thread (a
        snapshot taken by another thread, the planner's, leaves them for the loop)."""
        if not self._pending or threading.get_ident() != self._owner:
            return
        with self._lock:
            batch, self._pending = self._pending, []
        self.batches += 1
        for apply, ep, value in batch:
            apply(ep, value)  # each checks the endpoint is still the one scraped
        self.applied += len(batch)

    async def close(self) -> None:
        """On `loop`: stop the poll, leave the datastore, drop what is pending."""
        with self._lock:
            self._closed = True
            self._pending.clear()
        if self._remove_inbox is not None:
            self._remove_inbox()
            self._remove_inbox = None
        if self._poll is not None:
            self._poll.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poll
            self._poll = None


class ScraperThread:
    """The scraper on its own thread, feeding `datastore` on the loop that calls
    `start()`. `async with ScraperThread(ds, config): ...` or `start()` / `await stop()`.
    `scraper` is the `SelectorScraper` (http) or the `MetricsScraper` (https).
    """

    def __init__(self, datastore: Datastore, config: ScrapeConfig | None = None) -> None:
        self.datastore = datastore
        self.config = config or ScrapeConfig()
        self.scraper: SelectorScraper | MetricsScraper | None = None
        self.sink: HandoverSink | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None

    def start(self) -> None:
        """Start the thread; must run on the datastore's loop (results are applied there)."""
        if self._thread is not None:
            return
        self.sink = HandoverSink(
            DatastoreSink(self.datastore), asyncio.get_running_loop(), self.config.interval
        )
        if self.config.scheme == "http":
            self.scraper = SelectorScraper(self.datastore, self.config, self.sink)
            target = self.scraper.run
        else:
            target = self._asyncio_main
        self._thread = threading.Thread(target=target, name=THREAD_NAME, daemon=True)
        self._thread.start()
        if target == self._asyncio_main:
            if not self._started.wait(_START_TIMEOUT):
                raise RuntimeError(f"the scraper thread did not start within {_START_TIMEOUT:g}s")
            if self._error is not None:
                raise RuntimeError(f"the scraper thread failed to start: {self._error}")
        self.sink.start()  # results that came already wait in it

    def _asyncio_main(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        try:
            self.scraper = MetricsScraper(self.datastore, self.config, sink=self.sink)
            loop.run_until_complete(self._start_scraper())
        except BaseException as e:  # reported by start()
            self._error = e
            self._started.set()
            loop.close()
            return
        self._started.set()
        try:
            loop.run_forever()
        finally:
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()

    async def _start_scraper(self) -> None:
        assert isinstance(self.scraper, MetricsScraper)
        self.scraper.start()

    async def stop(self) -> None:
        """Stop the scraper, end the thread, join it (off the caller's loop)."""
        thread, loop, scraper = self._thread, self._loop, self.scraper
        if thread is None:
            return
        self._thread = None
        if self.sink is not None:
            await self.sink.close()
        if isinstance(scraper, SelectorScraper):
            scraper.stop()
        elif loop is not None and not loop.is_closed() and thread.is_alive():
            if scraper is not None:
                fut = asyncio.run_coroutine_threadsafe(scraper.stop(), loop)
                try:
                    await asyncio.wrap_future(fut)
                except Exception:
                    log.exception("stopping the scraper failed")
            loop.call_soon_threadsafe(loop.stop)
        await asyncio.to_thread(thread.join)

    async def __aenter__(self) -> ScraperThread:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def failing(self) -> dict[str, str]:
        """Endpoints whose last scrape failed, with the reason (a copy, any thread)."""
        return self.scraper.failing() if self.scraper is not None else {}
