"""Garbage and huge /metrics pages (issue 13 §3): the endpoint is a failed scrape with a
reason, the page is not read past the limit, and a good endpoint beside it stays healthy."""

import os

from aiohttp import web

from epp.datalayer.scraper import MetricsScraper
from epp.datastore import Datastore, Endpoint
from tests.eventually import eventually
from tests.unit.test_loopclock import PAGE

LIMIT = 64 * 1024


async def serve(routes: dict) -> tuple[web.AppRunner, int]:
    app = web.Application()
    for path, handler in routes.items():
        app.router.add_get(path, handler)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, runner.addresses[0][1]


async def test_huge_and_garbage_pages_fail_their_endpoint_only():
    async def good(_):
        return web.Response(text=PAGE)

    async def huge(_):  # announced with content-length: refused before reading
        return web.Response(body=b"#" * (LIMIT + 1))

    async def endless(request):  # chunked, never ending on its own: read stops at the limit
        resp = web.StreamResponse()
        await resp.prepare(request)
        try:
            for _ in range(10_000):  # at most 640 MB if nobody stopped reading
                await resp.write(b"# " + b"x" * 65_534)
        except (ConnectionResetError, RuntimeError):
            pass
        return resp

    async def garbage(_):
        return web.Response(body=os.urandom(4096))

    runner, port = await serve(
        {
            "/good/metrics": good,
            "/huge/metrics": huge,
            "/endless/metrics": endless,
            "/garbage/metrics": garbage,
        }
    )
    ds = Datastore()
    names = ("good", "huge", "endless", "garbage")
    ds.set_endpoints([Endpoint(n, "127.0.0.1", port) for n in names])
    # Without the bound the endless page is read until the 2 s timeout ("timeout after
    # 2s"), the huge one is parsed: the exact reasons below show the bound cut them off.
    scraper = MetricsScraper(
        ds, interval=0.05, timeout=2.0, models_interval=0, max_page_bytes=LIMIT
    )
    # each endpoint has its own path: route by name
    scraper._url = lambda ep, path: f"http://127.0.0.1:{port}/{ep.name}{path}"  # type: ignore[method-assign]
    try:
        async with scraper:
            await eventually(lambda: all(ds.last_error(n) for n in names[1:]), "3 failures", 15)
            await eventually(lambda: ds.is_healthy("good"), "good endpoint", 15)
    finally:
        await runner.cleanup()
    assert ds.last_error("huge") == f"metrics page of {LIMIT + 1} bytes exceeds {LIMIT}"
    assert ds.last_error("endless") == f"metrics page exceeds {LIMIT} bytes"
    assert "no vllm metrics" in ds.last_error("garbage")
    assert [ds.is_healthy(n) for n in names] == [True, False, False, False]
