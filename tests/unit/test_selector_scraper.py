"""The scraper thread's selector loop (issue 13 §6) against real loopback servers: raw
asyncio TCP servers where the test needs a server to misbehave at the protocol level
(hang, close kept-alive connections, answer garbage), aiohttp where it is an ordinary
model server. Everything runs through `ScraperThread`, as `epp serve` runs it."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Awaitable, Callable

import pytest

from epp.datalayer.scrape_thread import THREAD_NAME, ScraperThread
from epp.datalayer.scraper import ScrapeConfig
from epp.datalayer.selector_scraper import SelectorScraper
from epp.datastore import Datastore, Endpoint, EndpointMetrics
from tests.eventually import eventually
from tests.unit.test_datalayer_scraper import FakeServer, ep_for

pytest_plugins = ["tests.unit.test_datalayer_scraper"]  # make_server

PAGE = FakeServer(waiting=2).page().encode()
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def ok(body: bytes = PAGE, extra: str = "") -> bytes:
    return (
        f"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


async def read_request(reader: asyncio.StreamReader) -> bytes | None:
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None


class RawServers:
    def __init__(self) -> None:
        self.servers: list[asyncio.Server] = []
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self, handler: Handler) -> int:
        async def wrapped(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.writers.append(writer)
            try:
                await handler(reader, writer)
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                writer.close()

        server = await asyncio.start_server(wrapped, "127.0.0.1", 0)
        self.servers.append(server)
        return server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        for w in self.writers:
            w.close()
        for s in self.servers:
            s.close()
            await s.wait_closed()


@pytest.fixture
async def raw():
    servers = RawServers()
    yield servers
    await servers.close()


class CountingDatastore(Datastore):
    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.updates: dict[str, int] = {}
        self.failures: list[tuple[str, str]] = []

    def update_metrics(self, name: str, metrics: EndpointMetrics) -> None:
        self.updates[name] = self.updates.get(name, 0) + 1
        super().update_metrics(name, metrics)

    def mark_scrape_failed(self, name: str, error: str) -> None:
        self.failures.append((name, error))
        super().mark_scrape_failed(name, error)


def ep(name: str, port: int) -> Endpoint:
    return Endpoint(name, "127.0.0.1", port)


async def test_a_hanging_endpoint_times_out_alone(raw, make_server) -> None:
    """A server that reads the request and never answers: its scrapes time out after
    `timeout` (the connection, in an unknown state, is replaced), while the good
    endpoint beside it keeps being scraped at its own pace."""
    accepted = 0

    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        await read_request(reader)
        await asyncio.sleep(3600)

    port = await raw.start(hang)
    good = await make_server()
    ds = CountingDatastore()
    ds.set_endpoints([ep("hang", port), ep_for("good", good)])
    cfg = ScrapeConfig(interval=0.02, timeout=0.3, models_interval=0)
    async with ScraperThread(ds, cfg):
        await eventually(lambda: ds.last_error("hang") == "timeout after 0.3s", "a timeout")
        scraped = ds.updates.get("good", 0)
        await eventually(lambda: accepted >= 2, "a new connection for the next scrape")
        # 0.3 s per timed-out scrape; the good one at 0.02 s: several in the meantime
        await eventually(lambda: ds.updates.get("good", 0) >= scraped + 5, "good keeps going")
        assert ds.is_healthy("good") and not ds.is_healthy("hang")


async def test_garbage_huge_and_non_http_pages_fail_with_their_reason(raw) -> None:
    limit = 64 * 1024

    def answering(payload: bytes) -> Handler:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while await read_request(reader) is not None:
                writer.write(payload)
                await writer.drain()

        return handler

    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(10_000):  # 640 MB if nobody stopped reading
            writer.write(b"ffff\r\n" + b"#" * 0xFFFF + b"\r\n")
            await writer.drain()

    pages = {
        "good": answering(ok()),
        "garbage": answering(ok(os.urandom(4096))),
        "huge": answering(ok(b"#" * (limit + 1))),
        "not-http": answering(b"SSH-2.0-OpenSSH_9.6\r\n\r\n"),
        "endless": endless,
    }
    ds = CountingDatastore()
    ds.set_endpoints([ep(name, await raw.start(h)) for name, h in pages.items()])
    cfg = ScrapeConfig(interval=0.05, timeout=2.0, models_interval=0, max_page_bytes=limit)
    async with ScraperThread(ds, cfg):
        bad = [n for n in pages if n != "good"]
        await eventually(lambda: all(ds.last_error(n) for n in bad), "4 failures", 15)
        await eventually(lambda: ds.is_healthy("good"), "the good endpoint", 15)
    assert "no vllm metrics" in ds.last_error("garbage")
    assert ds.last_error("huge") == f"metrics page of {limit + 1} bytes exceeds {limit}"
    assert ds.last_error("endless") == f"metrics page exceeds {limit} bytes"  # not a timeout
    assert ds.last_error("not-http").startswith("ProtocolError: not an HTTP/1.x status line")


async def test_kept_alive_connections_closed_by_the_server_are_not_failures(raw) -> None:
    """Two servers that end connections: one says `Connection: close` and closes after
    each answer; one keeps the connection but drops it, without a byte, when the next
    request arrives (an idle timeout that fired as the request was sent: uvicorn and
    vLLM close idle connections after 5 s). Each scrape succeeds: the first on a new
    connection each time, the second by one retry on a fresh connection."""
    served = {"close": 0, "drop": 0}
    dropped = 0

    async def close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if await read_request(reader) is not None:
            served["close"] += 1
            writer.write(ok(extra="Connection: close\r\n"))
            await writer.drain()

    async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal dropped
        if await read_request(reader) is None:
            return
        served["drop"] += 1
        writer.write(ok())
        await writer.drain()
        if await read_request(reader) is not None:
            dropped += 1  # the second request on this connection: close, answer nothing

    ds = CountingDatastore()
    ds.set_endpoints([ep("close", await raw.start(close)), ep("drop", await raw.start(drop))])
    async with ScraperThread(ds, ScrapeConfig(interval=0.02, timeout=1.0, models_interval=0)):
        await eventually(lambda: min(ds.updates.get(n, 0) for n in served) >= 10, "10 scrapes each")
    assert dropped >= 5  # the retry path ran, not only fresh connections
    assert ds.failures == []
    # one connection per scrape for "close"; for "drop" one per scrape plus each drop
    assert served["drop"] >= ds.updates["drop"] - 1


async def test_a_changing_endpoint_adapts_its_interval(make_server) -> None:
    """Adaptive interval (`--refresh-metrics-max-interval`): unchanged metrics double the
    interval up to the maximum (0.01 → 0.02 → 0.04 → 0.08); changes bring it back."""
    srv = await make_server(waiting=1)
    ds = Datastore()
    ds.set_endpoints([ep_for("a", srv)])
    cfg = ScrapeConfig(interval=0.01, max_interval=0.08, timeout=0.5, models_interval=0)
    async with ScraperThread(ds, cfg) as st:
        scraper = st.scraper
        assert isinstance(scraper, SelectorScraper)
        await eventually(lambda: scraper.intervals.get("a") == 0.08, "backed off to the max")
        # from now on every page differs (the queue is the hit count): back to the minimum,
        # and kept there however late this loop looks
        srv.page = lambda: FakeServer(waiting=srv.hits).page()  # type: ignore[method-assign]
        await eventually(lambda: scraper.intervals["a"] == 0.01, "back to the minimum")
        await eventually(lambda: ds.metrics("a").waiting_queue_size > 1, "the change applied")


async def test_a_new_endpoint_is_scraped_without_waiting_for_the_idle_interval(
    make_server,
) -> None:
    """The pool changes on the request loop while the scraper thread sleeps until its
    next due scrape (here 5 s away): the change wakes it."""
    a, b = await make_server(), await make_server(waiting=5)
    ds = Datastore()
    ds.set_endpoints([ep_for("a", a)])
    cfg = ScrapeConfig(interval=0.01, max_interval=30.0, timeout=0.5, models_interval=0)
    async with ScraperThread(ds, cfg) as st:
        # 0.01 doubling: 5.12 s reached after 5.11 s; the thread then sleeps 5.12 s
        await eventually(lambda: st.scraper.intervals.get("a", 0) >= 5.12, "a backed off", 20)
        ds.set_endpoints([ep_for("a", a), ep_for("b", b)])
        await eventually(lambda: ds.is_healthy("b"), "b scraped", timeout=4.0)
        assert ds.metrics("b").waiting_queue_size == 5


async def test_host_names_resolve_off_the_thread_and_stop_leaves_no_thread(
    make_server,
) -> None:
    srv = await make_server(waiting=3)
    ds = Datastore()
    ds.set_endpoints([Endpoint("a", "localhost", srv.port)])
    before = {t.ident for t in threading.enumerate()}
    st = ScraperThread(ds, ScrapeConfig(interval=0.02, timeout=1.0, models_interval=0.05))
    st.start()
    try:
        await eventually(lambda: ds.is_healthy("a") and ds.models("a") is not None, "scraped")
    finally:
        await st.stop()
    assert ds.metrics("a").waiting_queue_size == 3

    def ours() -> list[str]:
        return [
            t.name
            for t in threading.enumerate()
            if t.ident not in before and t.name.startswith(THREAD_NAME)
        ]

    # the resolver's worker ends once its queue is shut (asynchronously)
    await eventually(lambda: not ours(), "no epp-scraper* thread left")


async def test_https_endpoints_are_scraped_by_the_asyncio_scraper_in_the_thread(tmp_path) -> None:
    """TLS stays asyncio's: with `scheme: https` the thread runs `MetricsScraper` on a
    loop of its own (self-signed certificate, `insecureSkipVerify` as upstream)."""
    import ssl

    from aiohttp import web

    from epp.datalayer.scraper import MetricsScraper
    from epp.extproc.tls import self_signed

    cert = self_signed(("127.0.0.1",))
    (tmp_path / "tls.crt").write_bytes(cert.cert_pem)
    (tmp_path / "tls.key").write_bytes(cert.key_pem)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    srv = FakeServer(waiting=6)
    app = web.Application()
    app.router.add_get("/metrics", srv.metrics)
    app.router.add_get("/v1/models", srv.list_models)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx).start()
    port = runner.addresses[0][1]
    ds = Datastore()
    ds.set_endpoints([ep("a", port)])
    try:
        cfg = ScrapeConfig(scheme="https", interval=0.02, timeout=1.0, models_interval=0)
        async with ScraperThread(ds, cfg) as st:
            assert isinstance(st.scraper, MetricsScraper)
            await eventually(lambda: ds.is_healthy("a"), "scraped over TLS")
            assert ds.metrics("a").waiting_queue_size == 6
            assert st.thread is not None and st.thread.name == THREAD_NAME
    finally:
        await runner.cleanup()


async def test_a_refused_connection_is_a_failure_with_its_reason() -> None:
    from epp.harness.procs import free_port

    ds = CountingDatastore()
    ds.set_endpoints([ep("gone", free_port())])  # nothing listens there
    async with ScraperThread(ds, ScrapeConfig(interval=0.02, timeout=1.0, models_interval=0)):
        await eventually(lambda: len(ds.failures) >= 3, "3 failed scrapes")
    assert {e for _, e in ds.failures} == {"connection refused"}
