"""The adaptive scrape interval on a scripted endpoint: a real loopback aiohttp server whose
/metrics answers from a script, polled by the real scraper under an injected clock and sleep
(no wall-clock time enters the test)."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from epp.datalayer.scraper import MetricsScraper, ScrapeConfig, next_interval
from epp.datastore import Datastore, Endpoint


def page(waiting: int) -> str:
    return (
        f'vllm:num_requests_waiting{{model_name="m"}} {waiting}\n'
        'vllm:num_requests_running{model_name="m"} 1\n'
        'vllm:kv_cache_usage_perc{model_name="m"} 0.5\n'
    )


class Pacer:
    """A clock that moves only when the scraper sleeps; records every sleep; parks the
    scraper for good after `n` of them."""

    def __init__(self, n: int) -> None:
        self.t = 0.0
        self.n = n
        self.sleeps: list[float] = []
        self.done = asyncio.Event()

    def clock(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.t += seconds
        if len(self.sleeps) >= self.n:
            self.done.set()
            await asyncio.Event().wait()  # until the scraper is stopped
        await asyncio.sleep(0)


async def run_script(script: list[int | None], **config: float) -> list[float]:
    """Scrape a server answering `script` in order (None = HTTP 500); the sleeps taken."""
    answers = iter(script)

    async def metrics(request: web.Request) -> web.Response:
        waiting = next(answers)
        if waiting is None:
            return web.Response(status=500, text="boom")
        return web.Response(text=page(waiting), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    ds = Datastore()
    ds.set_endpoints([Endpoint("s", "127.0.0.1", port)])
    pacer = Pacer(len(script))
    cfg = ScrapeConfig(models_interval=0, **config)
    try:
        async with MetricsScraper(ds, cfg, clock=pacer.clock, sleep=pacer.sleep):
            await asyncio.wait_for(pacer.done.wait(), 30)
    finally:
        await runner.cleanup()
    return pacer.sleeps


async def test_idle_endpoint_backs_off_and_a_change_brings_the_fast_rate_back():
    script = [1, 1, 1, 1, 1, 2, 2, 2, None, 2]
    sleeps = await run_script(script, interval=0.25, max_interval=1.0)
    assert sleeps == [
        0.25,  # first scrape: a state where there was none
        0.5,  # unchanged: doubled
        1.0,  # unchanged: doubled
        1.0,  # capped at max_interval
        1.0,
        0.25,  # waiting 1 -> 2: back to the fast rate at once
        0.5,
        1.0,
        0.25,  # a failed scrape: fast again, to see the recovery soon
        0.5,  # recovered with the state it had: backing off again
    ]


async def test_fixed_interval_without_max_interval():
    sleeps = await run_script([1, 1, 1, 2, 2], interval=0.25)
    assert sleeps == [0.25] * 5


def test_next_interval_rule():
    assert next_interval(0.25, False, 0.25, 1.0) == 0.5
    assert next_interval(0.75, False, 0.25, 1.0) == 1.0  # 1.5 capped
    assert next_interval(1.0, True, 0.25, 1.0) == 0.25
    assert next_interval(0.05, False, 0.05, 0.0) == 0.05  # 0 = fixed


def test_max_interval_below_interval_is_refused():
    with pytest.raises(ValueError, match="max_interval must be 0 \\(fixed\\) or >= interval"):
        ScrapeConfig(interval=0.5, max_interval=0.25)


def serve_args(*extra: str):
    from epp.cli import build_parser

    argv = ["serve", "--endpoint", "s=127.0.0.1:8000", *extra]
    parser, _ = build_parser(argv)
    return parser.parse_args(argv)


def test_serve_flag_reaches_the_scraper_config():
    from epp.serve import options_from_args

    opts, _ = options_from_args(
        serve_args("--refresh-metrics-interval", "0.25", "--refresh-metrics-max-interval", "1")
    )
    assert (opts.refresh_metrics_interval, opts.refresh_metrics_max_interval) == (0.25, 1.0)


@pytest.mark.parametrize(
    "flags",
    [
        ("--refresh-metrics-interval", "0.5", "--refresh-metrics-max-interval", "0.25"),
        # An idle endpoint scraped every 2 s would go stale at the 2 s threshold.
        ("--refresh-metrics-max-interval", "2"),
    ],
)
def test_serve_refuses_a_max_interval_outside_interval_and_staleness(flags):
    from epp.config.errors import ConfigError
    from epp.serve import options_from_args

    with pytest.raises(ConfigError, match="--refresh-metrics-max-interval must be 0 or between"):
        options_from_args(serve_args(*flags))


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ((), (0.05, 1.0)),  # the default: 50 ms while metrics change, up to 1 s idle
        (("--refresh-metrics-max-interval", "0"), (0.05, 0.0)),  # upstream's fixed 50 ms
        # A 1 s staleness threshold: the ceiling is half of it, 0.5 s, so an idle endpoint
        # is read twice per threshold and never goes stale.
        (("--metrics-staleness-threshold", "1"), (0.05, 0.5)),
        # An interval already at or above the 1 s ceiling: fixed, as given.
        (("--refresh-metrics-interval", "1.5"), (1.5, 0.0)),
    ],
)
def test_serve_scrapes_adaptively_by_default(flags, expected):
    from epp.serve import options_from_args

    opts, _ = options_from_args(serve_args(*flags))
    assert (opts.refresh_metrics_interval, opts.refresh_metrics_max_interval) == expected
