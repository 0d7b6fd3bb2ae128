"""The scraper's keep-alive GET client (epp/datalayer/httpget.py) against real loopback
servers: aiohttp for the common case, raw asyncio servers for exact framings."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
from aiohttp import web

from epp.datalayer.httpget import BodyTooLarge, ConnectError, HttpGetClient, ProtocolError
from tests.unit.test_datalayer_scraper import free_port


@pytest.fixture
async def aiohttp_server() -> AsyncIterator[tuple[int, set[object]]]:
    """/page answers 'x' * n (n from ?n=), and records each client connection's peer."""
    peers: set[object] = set()

    async def page(request: web.Request) -> web.Response:
        peers.add(request.transport.get_extra_info("peername") if request.transport else None)
        return web.Response(body=b"x" * int(request.query.get("n", "10")))

    app = web.Application()
    app.router.add_get("/page", page)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield runner.addresses[0][1], peers
    await runner.cleanup()


async def raw_server(
    answer: Callable[[int], bytes], close_after: bool = False
) -> tuple[asyncio.Server, int, list[int]]:
    """Answers the k-th request on a connection with `answer(k)` (closing after it with
    `close_after`, or on an empty answer); counts connections."""
    conns: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conns.append(1)
        k = 0
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                data = answer(k)
                k += 1
                if not data:
                    break
                writer.write(data)
                await writer.drain()
                if close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], conns


async def test_one_connection_serves_many_requests(aiohttp_server) -> None:
    port, peers = aiohttp_server
    client = HttpGetClient()
    bodies = [await client.get("127.0.0.1", port, f"/page?n={n}") for n in (1, 30_000, 5)]
    assert [len(r.body) for r in bodies] == [1, 30_000, 5]
    assert all(r.status == 200 for r in bodies)
    assert len(peers) == 1  # kept alive: every request on the same client port
    assert client.idle_connections == 1
    client.close()
    assert client.idle_connections == 0


async def test_chunked_body_with_trailers_is_decoded() -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nX-Trailer: t\r\n\r\n"
    )
    server, port, conns = await raw_server(lambda k: chunked)
    client = HttpGetClient()
    try:
        first = await client.get("127.0.0.1", port, "/")
        second = await client.get("127.0.0.1", port, "/")
    finally:
        client.close()
        server.close()
    assert first.body == second.body == b"hello, world"
    assert len(conns) == 1


async def test_a_connection_closed_while_idle_is_retried_once_on_a_new_one() -> None:
    # The server answers one request per connection, then closes (as uvicorn does after
    # its keep-alive timeout), without saying so in a header.
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    server, port, conns = await raw_server(lambda k: ok if k == 0 else b"")
    client = HttpGetClient()
    try:
        for _ in range(3):
            assert (await client.get("127.0.0.1", port, "/")).body == b"ok"
    finally:
        client.close()
        server.close()
    assert len(conns) == 3


async def test_body_until_close_and_limits() -> None:
    until_close = b"HTTP/1.0 200 OK\r\n\r\n" + b"y" * 1000
    server, port, _ = await raw_server(lambda k: until_close, close_after=True)
    client = HttpGetClient()
    try:
        # HTTP/1.0 without a length: the body is what comes until the server closes
        resp = await asyncio.wait_for(client.get("127.0.0.1", port, "/"), 10)
        assert resp.body == b"y" * 1000 and client.idle_connections == 0
        with pytest.raises(BodyTooLarge) as info:
            await asyncio.wait_for(client.get("127.0.0.1", port, "/", max_bytes=999), 10)
        assert info.value.announced is None and info.value.limit == 999
    finally:
        client.close()
        server.close()


async def test_announced_length_over_the_limit_is_refused_before_reading(
    aiohttp_server,
) -> None:
    port, _ = aiohttp_server
    client = HttpGetClient()
    with pytest.raises(BodyTooLarge) as info:
        await client.get("127.0.0.1", port, "/page?n=2000", max_bytes=1000)
    assert info.value.announced == 2000
    assert client.idle_connections == 0  # a refused read leaves the connection closed
    client.close()


async def test_garbage_and_refused_connections() -> None:
    server, port, _ = await raw_server(lambda k: b"SSH-2.0-OpenSSH\r\n\r\n")
    client = HttpGetClient()
    try:
        with pytest.raises(ProtocolError, match=r"not an HTTP/1\.x status line"):
            await client.get("127.0.0.1", port, "/")
        with pytest.raises(ConnectError) as info:
            await client.get("127.0.0.1", free_port(), "/")
        assert isinstance(info.value.os_error, ConnectionRefusedError)
    finally:
        client.close()
        server.close()
