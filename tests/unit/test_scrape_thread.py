"""The scraper on its own thread (issue 13 §6): results reach the datastore on the
datastore's loop only, a stalled request loop does not make the pool stale, the pool is
followed, and stop() leaves no thread behind. Real loopback aiohttp servers."""

from __future__ import annotations

import asyncio
import threading
import time

from epp.datalayer.loopclock import LoopClock
from epp.datalayer.scrape_thread import THREAD_NAME, HandoverSink, ScraperThread
from epp.datalayer.scraper import DatastoreSink, ScrapeConfig
from epp.datalayer.selector_scraper import SelectorScraper
from epp.datastore import Datastore, EndpointMetrics
from tests.eventually import eventually
from tests.unit.test_datalayer_scraper import ep_for

# the loopback FakeServer fixture of the scraper tests
pytest_plugins = ["tests.unit.test_datalayer_scraper"]

FAST = ScrapeConfig(interval=0.01, timeout=0.5, models_interval=0.02)


class ThreadCheckingDatastore(Datastore):
    """Records the thread of every write (the scheduling path reads without locks)."""

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.writers: set[str] = set()

    def update_metrics(self, name: str, metrics: EndpointMetrics) -> None:
        self.writers.add(threading.current_thread().name)
        super().update_metrics(name, metrics)

    def mark_scrape_failed(self, name: str, error: str) -> None:
        self.writers.add(threading.current_thread().name)
        super().mark_scrape_failed(name, error)

    def set_models(self, name: str, models: object) -> None:
        self.writers.add(threading.current_thread().name)
        super().set_models(name, models)  # type: ignore[arg-type]


def scraper_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


async def test_results_are_written_on_the_datastore_loop_only(make_server) -> None:
    srv = await make_server(waiting=4)
    ds = ThreadCheckingDatastore()
    ds.set_endpoints([ep_for("a", srv)])
    async with ScraperThread(ds, FAST) as st:
        await eventually(lambda: ds.is_healthy("a") and ds.models("a") is not None, "scraped")
        assert ds.metrics("a").waiting_queue_size == 4
        srv.waiting = 9
        await eventually(lambda: ds.metrics("a").waiting_queue_size == 9, "the change")
        assert st.thread is not None and st.thread.name == THREAD_NAME
        assert st.sink is not None and st.sink.applied >= 2
    assert ds.writers == {threading.current_thread().name}


async def test_failures_and_pool_changes_follow(make_server) -> None:
    a, b = await make_server(), await make_server(status=500)
    ds = Datastore()
    ds.set_endpoints([ep_for("a", a)])
    async with ScraperThread(ds, FAST) as st:
        await eventually(lambda: ds.is_healthy("a"), "a healthy")
        ds.set_endpoints([ep_for("b", b)])  # a leaves, b (failing) comes
        await eventually(lambda: ds.last_error("b") == "HTTP 500", "b failing")
        assert st.failing() == {"b": "HTTP 500"}
        assert not ds.is_healthy("b")
        hits = a.hits
        await eventually(lambda: b.hits >= 5, "b scraped again")
        assert a.hits <= hits + 1  # a is no longer polled (one scrape may be in flight)


async def test_stop_joins_the_thread_and_closes_connections(make_server) -> None:
    servers = [await make_server() for _ in range(3)]
    ds = Datastore()
    ds.set_endpoints([ep_for(f"e{i}", s) for i, s in enumerate(servers)])
    before = len(scraper_threads())
    st = ScraperThread(ds, FAST)
    st.start()
    await eventually(lambda: all(ds.is_healthy(f"e{i}") for i in range(3)), "all healthy")
    assert len(scraper_threads()) == before + 1
    scraper = st.scraper
    assert isinstance(scraper, SelectorScraper)  # http: the selector loop
    await eventually(lambda: scraper.open_connections >= 3, "kept-alive connections")
    await st.stop()
    assert len(scraper_threads()) == before
    assert not scraper.running
    assert scraper.open_connections == 0
    # A scrape written before stop() closed its socket can still be counted by the
    # servers, which run on this test's loop: let them read what was sent, then count.
    await asyncio.sleep(0.1)
    hits = [s.hits for s in servers]
    ds.set_endpoints([ep_for("e0", servers[0])])  # after stop: nothing reacts
    await asyncio.sleep(0.1)
    assert [s.hits for s in servers] == hits


async def test_a_stalled_request_loop_does_not_make_the_pool_stale(make_server) -> None:
    """The request loop stands still 2.5 s (staleness 2 s) without releasing the GIL
    for long (a busy loop of Python work): the endpoint is healthy right after."""
    srv = await make_server()
    clock = LoopClock()
    clock.start()
    ds = Datastore(staleness=2.0, clock=clock.now)
    ds.set_endpoints([ep_for("a", srv)])
    try:
        async with ScraperThread(ds, FAST):
            await eventually(lambda: ds.is_healthy("a"), "healthy")
            end = time.monotonic() + 2.5
            while time.monotonic() < end:  # CPU-bound on this loop: nothing else runs here
                sum(range(1000))
            assert ds.is_healthy("a")
    finally:
        await clock.stop()


async def test_handover_applies_in_order_at_the_next_snapshot_and_drops_after_close():
    ds = Datastore(require_metrics=False)
    ep = ep_for("a", 1)
    ds.set_endpoints([ep])
    sink = HandoverSink(DatastoreSink(ds), asyncio.get_running_loop(), interval=3600)
    sink.start()  # the poll is an hour away: only snapshots drain here
    m1, m2 = EndpointMetrics(waiting_queue_size=1), EndpointMetrics(waiting_queue_size=2)

    def produce() -> None:  # from another thread, as the scraper thread does
        sink.metrics(ep, m1)
        sink.failed(ep, "HTTP 503")
        sink.metrics(ep, m2)

    await asyncio.to_thread(produce)
    assert sink.applied == 0 and ds.metrics("a") == EndpointMetrics()  # waiting
    # a snapshot taken by another thread (the planner's) leaves them for the loop
    await asyncio.to_thread(ds.snapshot)
    assert sink.applied == 0
    (snap,) = ds.snapshot()  # on the loop: all three applied first, in order, once
    assert sink.applied == 3 and sink.batches == 1
    assert snap.metrics == m2 and ds.last_error("a") == ""  # the last one wins
    moved = ep_for("a", 2)  # re-addressed: a result for the old address is dropped
    ds.set_endpoints([moved])
    await asyncio.to_thread(sink.metrics, ep, m1)
    ds.snapshot()
    assert sink.applied == 4 and ds.metrics("a") != m1
    await sink.close()
    await asyncio.to_thread(sink.metrics, moved, m1)
    ds.snapshot()
    assert sink.applied == 4 and ds.metrics("a") != m1


async def test_an_idle_loop_gets_results_from_the_poll():
    ds = Datastore()
    ep = ep_for("a", 1)
    ds.set_endpoints([ep])
    sink = HandoverSink(DatastoreSink(ds), asyncio.get_running_loop(), interval=0.01)
    sink.start()
    await asyncio.to_thread(sink.metrics, ep, EndpointMetrics(waiting_queue_size=5))
    await eventually(lambda: sink.applied == 1, "the poll")  # no snapshot taken
    assert ds.metrics("a").waiting_queue_size == 5
    await sink.close()
