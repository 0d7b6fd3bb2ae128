"""The scraper against real aiohttp servers on loopback ports (no fixed sleeps)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from epp.datalayer.scraper import MetricsScraper, ScrapeConfig
from epp.datastore import Datastore, Endpoint
from epp.harness.procs import free_port
from tests.eventually import eventually

FAST = {"interval": 0.01, "timeout": 0.5, "models_interval": 0.02}


@dataclass
class FakeServer:
    """A model server whose /metrics and /v1/models the test changes at will."""

    waiting: int = 3
    running: int = 1
    kv: float = 0.25
    status: int = 200
    body: str | None = None  # overrides the generated page
    delay: float = 0.0
    models: list[str] = field(default_factory=lambda: ["base", "lora-a"])
    engine: str = "vllm"
    hits: int = 0
    port: int = 0

    def page(self) -> str:
        if self.body is not None:
            return self.body
        if self.engine == "sglang":
            return (
                f'sglang:num_queue_reqs{{model_name="m"}} {self.waiting}\n'
                f'sglang:num_running_reqs{{model_name="m"}} {self.running}\n'
                f'sglang:token_usage{{model_name="m"}} {self.kv}\n'
            )
        return (
            "# HELP vllm:num_requests_waiting Number of requests waiting.\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {float(self.waiting)}\n'
            f'vllm:num_requests_running{{engine="0",model_name="m"}} {float(self.running)}\n'
            f'vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {self.kv}\n'
            'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100"} 1.0\n'
        )

    async def metrics(self, request: web.Request) -> web.Response:
        self.hits += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.status != 200:
            return web.Response(status=self.status, text="boom")
        return web.Response(text=self.page(), content_type="text/plain")

    async def list_models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": m} for m in self.models]})


@pytest.fixture
async def make_server() -> AsyncIterator[Callable[..., object]]:
    runners: list[web.AppRunner] = []

    async def start(path: str = "/metrics", **kw: object) -> FakeServer:
        srv = FakeServer(**kw)  # type: ignore[arg-type]
        app = web.Application()
        app.router.add_get(path, srv.metrics)
        app.router.add_get("/v1/models", srv.list_models)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        srv.port = runner.addresses[0][1]
        return srv

    yield start
    for r in runners:
        await r.cleanup()


def ep_for(name: str, srv: FakeServer | int, **labels: str) -> Endpoint:
    port = srv if isinstance(srv, int) else srv.port
    return Endpoint(name, "127.0.0.1", port, labels)


def scrape_tasks() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("epp-scrape:")]


async def test_datastore_follows_the_server(make_server) -> None:
    srv = await make_server()
    ds = Datastore()
    ds.set_endpoints([ep_for("a", srv)])
    async with MetricsScraper(ds, **FAST) as scraper:
        await eventually(lambda: ds.is_healthy("a"), "first scrape")
        m = ds.metrics("a")
        assert m is not None
        assert (m.waiting_queue_size, m.running_requests, m.kv_cache_usage) == (3, 1, 0.25)
        assert (m.cache_block_size, m.cache_num_blocks) == (16, 100)
        srv.waiting, srv.kv = 9, 0.75
        await eventually(lambda: ds.metrics("a").waiting_queue_size == 9, "changed queue")
        assert ds.metrics("a").kv_cache_usage == 0.75
        await eventually(lambda: "a" in scraper.served_models, "models")
        assert scraper.served_models["a"] == frozenset({"base", "lora-a"})
        srv.models = ["base"]
        await eventually(lambda: scraper.served_models["a"] == {"base"}, "models change")
        hits = srv.hits
        await eventually(lambda: srv.hits >= hits + 5, "more scrapes")  # it keeps polling


async def test_update_time_comes_from_the_injected_clock(make_server) -> None:
    srv = await make_server()
    now = [1000.0]
    ds = Datastore(staleness=2.0, clock=lambda: now[0])
    ds.set_endpoints([ep_for("a", srv)])
    scraper = MetricsScraper(ds, **FAST)
    scraper.start()
    try:
        await eventually(lambda: ds.metrics("a").update_time == 1000.0, "stamped scrape")
        now[0] = 1500.0
        await eventually(lambda: ds.metrics("a").update_time == 1500.0, "restamped scrape")
        assert ds.is_healthy("a")
    finally:
        await scraper.stop()
    now[0] = 1503.0  # no scrapes any more: the last one goes stale
    assert not ds.is_healthy("a")


async def test_http_error_marks_unhealthy_and_recovers(make_server, caplog) -> None:
    caplog.set_level(logging.INFO, logger="epp.datalayer.scraper")
    srv = await make_server()
    ds = Datastore()
    ds.set_endpoints([ep_for("a", srv)])
    async with MetricsScraper(ds, **FAST) as scraper:
        await eventually(lambda: ds.is_healthy("a"), "healthy")
        srv.status = 500
        await eventually(lambda: not ds.is_healthy("a"), "unhealthy on 500")
        assert ds.last_error("a") == "HTTP 500"
        assert scraper.failing() == {"a": "HTTP 500"}
        hits = srv.hits
        await eventually(lambda: srv.hits >= hits + 5, "several failed scrapes")
        srv.status = 200
        await eventually(lambda: ds.is_healthy("a"), "recovery")
        assert scraper.failing() == {}
    records = [r for r in caplog.records if r.name == "epp.datalayer.scraper"]
    warnings = [r for r in records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in records]  # logged on transition only
    assert "HTTP 500" in warnings[0].getMessage()
    assert sum("recovered" in r.getMessage() for r in records) == 1


async def test_closed_port_is_unhealthy_then_recovers_when_server_appears(make_server) -> None:
    port = free_port()
    ds = Datastore()
    ds.set_endpoints([ep_for("a", port)])
    async with MetricsScraper(ds, **FAST):
        await eventually(lambda: ds.last_error("a") == "connection refused", "refused")
        assert not ds.is_healthy("a")
        srv = await make_server()  # a server on another port; re-point the endpoint
        ds.set_endpoints([ep_for("a", srv)])
        await eventually(lambda: ds.is_healthy("a"), "healthy on the new address")


async def test_timeout_and_garbage_page(make_server) -> None:
    slow = await make_server(delay=2.0)
    junk = await make_server(body="this is not\nprometheus {{{\n")
    ds = Datastore()
    ds.set_endpoints([ep_for("slow", slow), ep_for("junk", junk)])
    async with MetricsScraper(ds, interval=0.01, timeout=0.1, models_interval=0):
        await eventually(lambda: ds.last_error("slow").startswith("timeout"), "timeout")
        await eventually(lambda: "no vllm metrics" in ds.last_error("junk"), "parse error")
        assert "vllm:num_requests_waiting" in ds.last_error("junk")
        assert not ds.is_healthy("slow")
        assert not ds.is_healthy("junk")


async def test_engine_label_and_custom_path(make_server) -> None:
    srv = await make_server(path="/custom", engine="sglang", waiting=4, running=2, kv=0.5)
    ds = Datastore()
    ds.set_endpoints([ep_for("s", srv, **{"llm-d.ai/engine-type": "sglang"})])
    config = ScrapeConfig.from_params({"scheme": "http", "path": "/custom"}, **FAST)
    async with MetricsScraper(ds, config):
        await eventually(lambda: ds.is_healthy("s"), "sglang scrape")
        m = ds.metrics("s")
        assert (m.waiting_queue_size, m.running_requests, m.kv_cache_usage) == (4, 2, 0.5)


async def test_removed_endpoint_task_is_cancelled_and_new_one_started(make_server) -> None:
    s1, s2, s3 = await make_server(), await make_server(), await make_server()
    ds = Datastore()
    ds.set_endpoints([ep_for("a", s1), ep_for("b", s2)])
    async with MetricsScraper(ds, **FAST) as scraper:
        await eventually(lambda: ds.is_healthy("a") and ds.is_healthy("b"), "both healthy")
        b_tasks = [t for t in scrape_tasks() if t.get_name() == "epp-scrape:b"]
        assert len(b_tasks) == 1
        ds.set_endpoints([ep_for("a", s1), ep_for("c", s3)])
        assert sorted(scraper.task_names()) == ["a", "c"]
        await eventually(lambda: b_tasks[0].done(), "b's task to end")
        assert b_tasks[0].cancelled()
        hits = s2.hits
        await eventually(lambda: ds.is_healthy("c"), "c scraped")
        await asyncio.sleep(0.05)  # not a timing assert: b must simply see no more scrapes
        assert s2.hits <= hits + 1
        assert "b" not in scraper.served_models


async def test_stop_leaves_nothing_running(make_server) -> None:
    servers = [await make_server() for _ in range(3)]
    ds = Datastore()
    ds.set_endpoints([ep_for(f"e{i}", s) for i, s in enumerate(servers)])
    scraper = MetricsScraper(ds, **FAST)
    scraper.start()
    await eventually(lambda: all(ds.is_healthy(f"e{i}") for i in range(3)), "all healthy")
    ds.set_endpoints([ep_for("e0", servers[0])])  # leaves a cancelled task in flight
    client = scraper.client
    await scraper.stop()
    assert scrape_tasks() == []
    assert client is not None and client.idle_connections == 0  # every connection closed
    assert not scraper.running
    ds.set_endpoints([ep_for("e1", servers[1])])  # after stop: the listener is inert
    assert scrape_tasks() == []


async def test_endpoint_change_from_another_thread(make_server) -> None:
    srv = await make_server()
    ds = Datastore()
    async with MetricsScraper(ds, **FAST) as scraper:
        await asyncio.to_thread(ds.set_endpoints, [ep_for("t", srv)])
        await eventually(lambda: ds.is_healthy("t"), "scraped after a cross-thread change")
        assert scraper.task_names() == ["t"]


async def test_models_go_to_the_datastore_when_it_can_hold_them(make_server) -> None:
    class ModelDatastore(Datastore):
        def __init__(self) -> None:
            super().__init__()
            self.models: dict[str, frozenset[str]] = {}

        def set_models(self, name: str, models: frozenset[str]) -> None:
            self.models[name] = models

    srv = await make_server(models=["x", "y"])
    ds = ModelDatastore()
    ds.set_endpoints([ep_for("a", srv)])
    async with MetricsScraper(ds, **FAST):
        await eventually(lambda: ds.models.get("a") == {"x", "y"}, "set_models call")


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="scheme"):
        ScrapeConfig(scheme="ftp")
    with pytest.raises(ValueError, match="path"):
        ScrapeConfig(path="metrics")
    with pytest.raises(ValueError, match="interval"):
        ScrapeConfig(interval=0)
    with pytest.raises(ValueError, match="unknown engine"):
        ScrapeConfig(default_engine="nope")
    with pytest.raises(ValueError, match="insecureSkipVerify"):
        ScrapeConfig.from_params({"insecure": True})
    assert ScrapeConfig.from_params({"insecureSkipVerify": False}).insecure_skip_verify is False
    with pytest.raises(TypeError, match="intervall"):
        MetricsScraper(Datastore(), intervall=1)
