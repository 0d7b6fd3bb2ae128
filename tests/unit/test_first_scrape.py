"""The EPP takes requests only once each endpoint was scraped once (or a bound passed):
`epp.datalayer.first_scrape`."""

from __future__ import annotations

import asyncio

from epp.datalayer.first_scrape import await_first_scrape, never_scraped
from epp.datastore import Datastore, Endpoint, EndpointMetrics


def pool() -> Datastore:
    ds = Datastore()
    ds.set_endpoints([Endpoint("a", "10.0.0.1", 8000), Endpoint("b", "10.0.0.2", 8000)])
    return ds


def test_an_endpoint_counts_as_scraped_once_it_succeeded_or_failed():
    ds = pool()
    assert never_scraped(ds) == ["a", "b"]
    ds.update_metrics("a", EndpointMetrics(update_time=ds.clock()))
    assert never_scraped(ds) == ["b"]
    ds.mark_scrape_failed("b", "connection refused")
    assert never_scraped(ds) == []


async def test_the_wait_ends_when_the_last_endpoint_is_scraped():
    ds = pool()

    async def scraper() -> None:
        await asyncio.sleep(0)
        ds.update_metrics("a", EndpointMetrics(update_time=ds.clock()))
        await asyncio.sleep(0)
        ds.mark_scrape_failed("b", "timeout")

    task = asyncio.create_task(scraper())
    # a bound far beyond what the fake scraper takes: the wait ends on the event, not on it
    assert await await_first_scrape(ds, timeout_s=60) == []
    await task


async def test_the_wait_is_bounded_and_names_who_was_never_scraped():
    ds = pool()
    ds.update_metrics("a", EndpointMetrics(update_time=ds.clock()))
    assert await await_first_scrape(ds, timeout_s=0.05) == ["b"]
    assert await await_first_scrape(Datastore(), timeout_s=60) == []  # empty pool: no wait
