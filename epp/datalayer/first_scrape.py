"""Wait for the first scrape of every endpoint before the EPP takes requests.

An endpoint that was never scraped is unhealthy (`Datastore`), so an EPP that opens its
ext_proc port at once answers its first requests with 503 "no healthy endpoint" although
the pool is fine: measured when the EPP was restarted under load
(tests/e2e/test_faults_epp.py), 3 of ~1,000 requests, right after it said it served.
Waiting until each endpoint has been scraped once, well or not, closes that window; the
wait is bounded (one scrape timeout plus one interval), so a hung server cannot hold the
EPP's start.
"""

from __future__ import annotations

import asyncio

from epp.datastore import Datastore


def never_scraped(datastore: Datastore) -> list[str]:
    """Endpoints with neither a good scrape nor a failed one yet. Takes a snapshot first:
    that applies the scraper thread's pending hand-over, so a scrape that finished is
    seen now, not at the thread's next poll."""
    datastore.snapshot()
    return [
        e.name
        for e in datastore.endpoints()
        if not datastore.is_healthy(e.name) and not datastore.last_error(e.name)
    ]


async def await_first_scrape(
    datastore: Datastore, timeout_s: float, poll_s: float = 0.02
) -> list[str]:
    """Until every endpoint has been scraped once or `timeout_s` passed; returns the
    endpoints still never scraped (empty: all were)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while (pending := never_scraped(datastore)) and loop.time() < deadline:
        await asyncio.sleep(poll_s)
    return pending
