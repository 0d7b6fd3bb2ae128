"""Scrape staleness is judged in time the EPP's loop could run (issue 13 §1d): a stall of
the EPP itself must not make every endpoint look dead."""

import logging
import time

from aiohttp import web

from epp.datalayer.loopclock import LoopClock
from epp.datalayer.scraper import INCONCLUSIVE, MetricsScraper
from epp.datastore import Datastore, Endpoint, EndpointMetrics
from tests.eventually import eventually


class FakeTime:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_stall_does_not_advance_the_clock_and_it_never_goes_back():
    base = FakeTime()
    clock = LoopClock(tick=0.05, tolerance=0.05, base=base)
    clock.beat()
    base.t += 0.05
    clock.beat()
    assert clock.now() == 100.05  # an on-time beat: no stall
    base.t += 2.5  # the loop stalled: no beat for 2.5 s
    # only tick + tolerance (0.1 s) of the 2.5 s count, even before the heartbeat runs
    assert abs(clock.now() - 100.15) < 1e-9
    before = clock.now()
    clock.beat()  # the heartbeat catches up: the stall is booked, the reading unchanged
    assert abs(clock.stalled - 2.4) < 1e-9
    assert clock.now() == before
    for _ in range(20):  # then 1 s of on-time beats: all of it counts
        base.t += 0.05
        clock.beat()
    assert abs(clock.now() - 101.15) < 1e-9


async def stall_then_health(clock) -> bool:
    """A datastore on `clock` with one freshly scraped endpoint; the loop then stalls
    2.5 s (staleness threshold 2.0 s); is the endpoint healthy right after?"""
    ds = Datastore(staleness=2.0, clock=clock)
    ds.set_endpoints([Endpoint("a", "127.0.0.1", 1)])
    ds.update_metrics("a", EndpointMetrics(update_time=clock()))
    assert ds.is_healthy("a")
    time.sleep(2.5)  # the EPP's own loop is busy (a huge body parsed on it)
    return ds.is_healthy("a")


async def test_a_2_5s_loop_stall_leaves_a_fresh_endpoint_healthy():
    clock = LoopClock()
    clock.start()
    try:
        assert await stall_then_health(clock.now)
    finally:
        await clock.stop()
    # control: on the wall clock the same stall makes it stale (the defect)
    assert not await stall_then_health(time.monotonic)


class RecordingScraper(MetricsScraper):
    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.results: list[str | None] = []

    async def scrape_once(self, *a, **kw):
        result = await super().scrape_once(*a, **kw)
        self.results.append(result)
        return result


async def test_a_scrape_timing_out_during_a_loop_stall_is_not_a_failure(caplog):
    caplog.set_level(logging.INFO, logger="epp.datalayer.scraper")
    hits = 0

    async def metrics(_: web.Request) -> web.Response:
        nonlocal hits
        hits += 1
        if hits == 3:
            # The scrape that asked for this page is in flight while the whole loop
            # stands still for 2.5 s, past its 1 s timeout (and the 2 s staleness).
            time.sleep(2.5)
        return web.Response(text=PAGE, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    clock = LoopClock()
    clock.start()
    ds = Datastore(staleness=2.0, clock=clock.now)
    ds.set_endpoints([Endpoint("a", "127.0.0.1", runner.addresses[0][1])])
    scraper = RecordingScraper(ds, interval=0.05, timeout=1.0, models_interval=0)
    healthy_after_stall = []
    try:
        async with scraper:
            await eventually(lambda: hits >= 3, "the stalling scrape", timeout=10)
            healthy_after_stall.append(ds.is_healthy("a"))
            await eventually(lambda: hits >= 8, "scrapes after the stall", timeout=15)
            healthy_after_stall.append(ds.is_healthy("a"))
    finally:
        await clock.stop()
        await runner.cleanup()
    assert healthy_after_stall == [True, True]
    # the attempt caught in the stall is inconclusive or (if its reply won the race with
    # its timer) a success; never a failure
    assert all(r is None or r == INCONCLUSIVE for r in scraper.results), scraper.results
    assert not [r for r in caplog.records if "unavailable" in r.getMessage()]


PAGE = (
    'vllm:num_requests_waiting{model_name="m"} 0.0\n'
    'vllm:num_requests_running{model_name="m"} 0.0\n'
    'vllm:kv_cache_usage_perc{model_name="m"} 0.1\n'
)
