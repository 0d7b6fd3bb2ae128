"""A small keep-alive HTTP/1.1 GET client for the scraper: one reused connection per
endpoint, the response read by an asyncio Protocol, nothing else.

Why not aiohttp's ClientSession (what the scraper used): it is general (redirects,
cookies, tracing, a connector pool, a streaming reader) and costs ~0.55 ms of CPU per
GET of a 25 KB `/metrics` page on the 2-vCPU bench VM, against ~0.2 ms for a Protocol
that only frames one response (`bench/scrape_cost.py`, docs/BENCHMARKS.md@a73a134 "Request-path
cost"). The EPP polls every endpoint 20 times a second, so that difference is most of
what scraping costs.

What it speaks: `GET path HTTP/1.1` with a Host header; the response framed by
Content-Length, `Transfer-Encoding: chunked`, or the connection's end (HTTP/1.0 or
`Connection: close`). A body is read at most to `max_bytes` (a larger announced
Content-Length is refused before reading). Connections are kept and reused per
(host, port); one that the server closed while idle (uvicorn, vLLM's server, closes
after 5 s) is retried once on a fresh connection, since a GET is idempotent. TLS is
asyncio's (`ssl` context per client). Not supported: redirects, proxies, compression
(the scraper asks for `identity`), 1xx responses other than being skipped.
"""

from __future__ import annotations

import asyncio
import ssl as _ssl
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "BodyTooLarge",
    "ConnectError",
    "HttpGetClient",
    "ProtocolError",
    "Response",
    "ResponseReader",
    "request_bytes",
]

# A response head larger than this is not an HTTP server we want to read.
MAX_HEAD_BYTES = 64 * 1024


class ProtocolError(Exception):
    """The server's answer is not a readable HTTP/1.x response."""


class ConnectError(OSError):
    """The TCP (or TLS) connection could not be made; `os_error` says why."""

    def __init__(self, os_error: OSError) -> None:
        super().__init__(os_error.errno, os_error.strerror or str(os_error))
        self.os_error = os_error


class BodyTooLarge(Exception):
    """The body passes the caller's limit; `announced` is its Content-Length, if given."""

    def __init__(self, limit: int, announced: int | None) -> None:
        super().__init__(limit, announced)
        self.limit = limit
        self.announced = announced


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    headers: Mapping[str, str]  # names lower-cased; a repeated header keeps its last value
    body: bytes


class _Framing:
    LENGTH, CHUNKED, UNTIL_CLOSE = range(3)


class ResponseReader:
    """Frames one HTTP/1.x response from the bytes fed to it; no I/O, so the asyncio
    client below and the scraper's selector loop (`epp/datalayer/selector_scraper.py`)
    read responses the same way.

    `feed(data)` returns the `Response` once complete (else None) and raises
    `ProtocolError` or `BodyTooLarge`; `eof()` is the server closing the connection:
    the response, if it was framed by the close, else None. `keep_alive` is False once
    the head says the connection will not be reused.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.got_bytes = False
        self.keep_alive = True
        self._buf = bytearray()
        self._head: tuple[int, dict[str, str]] | None = None
        self._framing = _Framing.LENGTH
        self._length = 0
        self._body = bytearray()  # chunked: the decoded body so far

    def feed(self, data: bytes) -> Response | None:
        self.got_bytes = True
        self._buf += data
        return self._parse()

    def eof(self) -> Response | None:
        if self._head is not None and self._framing == _Framing.UNTIL_CLOSE:
            status, headers = self._head
            return Response(status, headers, bytes(self._buf))
        return None

    def _parse(self) -> Response | None:
        buf = self._buf
        while self._head is None:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    raise ProtocolError(f"response head over {MAX_HEAD_BYTES} bytes")
                return None
            status, headers = _parse_head(bytes(buf[:end]))
            del buf[: end + 4]
            if 100 <= status < 200:  # an interim response: the real one follows
                continue
            self._start_body(status, headers)
        status, headers = self._head
        if self._framing == _Framing.LENGTH:
            if len(buf) < self._length:
                return None
            if len(buf) > self._length:
                raise ProtocolError("more bytes than the announced Content-Length")
            return Response(status, headers, bytes(buf))
        if self._framing == _Framing.UNTIL_CLOSE:
            if len(buf) > self.max_bytes:
                raise BodyTooLarge(self.max_bytes, None)
            return None
        return self._parse_chunks(status, headers)

    def _start_body(self, status: int, headers: dict[str, str]) -> None:
        self._head = (status, headers)
        conn = headers.get("connection", "").lower()
        self.keep_alive = "close" not in conn
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self._framing = _Framing.CHUNKED
        elif "content-length" in headers:
            try:
                length = int(headers["content-length"])
            except ValueError:
                raise ProtocolError("Content-Length is not a number") from None
            if length < 0:
                raise ProtocolError("negative Content-Length")
            if length > self.max_bytes:
                raise BodyTooLarge(self.max_bytes, length)
            self._framing, self._length = _Framing.LENGTH, length
        elif status in (204, 304):
            self._framing, self._length = _Framing.LENGTH, 0
        else:
            self._framing, self.keep_alive = _Framing.UNTIL_CLOSE, False

    def _parse_chunks(self, status: int, headers: dict[str, str]) -> Response | None:
        buf, body = self._buf, self._body
        while True:
            line_end = buf.find(b"\r\n")
            if line_end < 0:
                if len(buf) > 1024:
                    raise ProtocolError("chunk size line too long")
                return None
            size_text = bytes(buf[:line_end]).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise ProtocolError(f"bad chunk size {size_text[:20]!r}") from None
            if size == 0:
                # The last chunk, then optional trailer lines, then an empty line:
                # "0\r\n\r\n" or "0\r\nname: value\r\n\r\n".
                end = buf.find(b"\r\n\r\n", line_end)
                if end < 0:
                    if len(buf) > MAX_HEAD_BYTES:
                        raise ProtocolError(f"trailers over {MAX_HEAD_BYTES} bytes")
                    return None
                del buf[: end + 4]
                return Response(status, headers, bytes(body))
            if len(body) + size > self.max_bytes:
                raise BodyTooLarge(self.max_bytes, None)
            need = line_end + 2 + size + 2
            if len(buf) < need:
                return None
            body += buf[line_end + 2 : line_end + 2 + size]
            del buf[:need]


class _Conn(asyncio.Protocol):
    """One connection; at most one request in flight (the client guarantees it)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._reader = ResponseReader(0)
        self._waiter: asyncio.Future[Response] | None = None

    # ---- asyncio.Protocol ------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._waiter is None or self._waiter.done():
            # Bytes nobody asked for: the connection is out of step; never reuse it.
            self.close()
            return
        try:
            response = self._reader.feed(data)
        except (ProtocolError, BodyTooLarge) as e:
            self.close()
            self._waiter.set_exception(e)
            return
        if response is not None:
            if not self._reader.keep_alive:
                self.close()
            self._waiter.set_result(response)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        response = self._reader.eof()
        if response is not None:
            waiter.set_result(response)
            return
        error = ProtocolError("connection closed by the server before a full response")
        if exc is not None:
            error.__cause__ = exc
        waiter.set_exception(error)

    # ---- use -----------------------------------------------------------------
    def request(self, raw: bytes, max_bytes: int) -> asyncio.Future[Response]:
        assert self.transport is not None and not self.closed
        self._reader = ResponseReader(max_bytes)
        self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(raw)
        return self._waiter

    @property
    def answered_nothing(self) -> bool:
        """No byte of the current response arrived (a stale keep-alive connection)."""
        return not self._reader.got_bytes

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise ProtocolError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise ProtocolError(f"bad header line {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    if parts[0] == "HTTP/1.0" and "keep-alive" not in headers.get("connection", "").lower():
        headers.setdefault("connection", "close")
    return int(parts[1]), headers


def request_bytes(
    host: str, port: int, path: str, headers: Mapping[str, str] | None = None
) -> bytes:
    """The bytes of `GET path HTTP/1.1` to host:port with `headers`."""
    host_header = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    lines = [f"GET {path} HTTP/1.1", f"Host: {host_header}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class HttpGetClient:
    """GETs over kept-alive connections, one pool of idle connections per (host, port).

    `ssl_context` None speaks plain HTTP. Use from one event loop; `close()` closes every
    idle connection (one in use is closed when its request ends).
    """

    def __init__(self, ssl_context: _ssl.SSLContext | None = None) -> None:
        self._ssl = ssl_context
        self._idle: dict[tuple[str, int], list[_Conn]] = {}
        self._closed = False

    async def get(
        self,
        host: str,
        port: int,
        path: str,
        *,
        headers: Mapping[str, str] | None = None,
        max_bytes: int = 16 * 1024 * 1024,
    ) -> Response:
        """One GET; raises ConnectError, ProtocolError, BodyTooLarge (and the caller's
        timeout, if it set one: the connection is then dropped)."""
        key = (host, port)
        raw = request_bytes(host, port, path, headers)
        conn = self._take(key)
        if conn is not None:
            try:
                return await self._exchange(key, conn, raw, max_bytes)
            except ProtocolError:
                if not conn.answered_nothing:
                    raise
                # The server closed the idle connection: once more on a new one.
        conn = await self._connect(host, port)
        return await self._exchange(key, conn, raw, max_bytes)

    async def _exchange(
        self, key: tuple[str, int], conn: _Conn, raw: bytes, max_bytes: int
    ) -> Response:
        try:
            response = await conn.request(raw, max_bytes)
        except BaseException:
            conn.close()  # timeout, cancellation, error: its state is unknown
            raise
        if not conn.closed and not self._closed:
            self._idle.setdefault(key, []).append(conn)
        return response

    def _take(self, key: tuple[str, int]) -> _Conn | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.closed:
                return conn
        return None

    async def _connect(self, host: str, port: int) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(
                _Conn, host, port, ssl=self._ssl, server_hostname=host if self._ssl else None
            )
        except OSError as e:
            raise ConnectError(e) from e
        return conn

    def forget(self, host: str, port: int) -> None:
        """Close the idle connections to one server (it left the pool)."""
        for conn in self._idle.pop((host, port), []):
            conn.close()

    def close(self) -> None:
        self._closed = True
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()

    @property
    def idle_connections(self) -> int:
        return sum(len(c) for c in self._idle.values())
