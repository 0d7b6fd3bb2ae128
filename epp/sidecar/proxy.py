"""The sidecar's HTTP proxy: remote prefill on request, everything else passed through.

Every path is proxied to the local decode server, byte for byte and as it arrives (an
SSE stream is relayed chunk by chunk, status and headers kept), so the sidecar can sit
on the port the pool lists. Three paths are the sidecar's own:

- `POST` chat/completions/responses with `x-prefiller-host-port`: the remote-prefill
  protocol (`protocol.py`): prefill leg to the named server (allowlisted, else 403),
  then the decode leg here, both with one `x-request-id`. A prefill 4xx is the
  client's problem and goes back as is; a 5xx, timeout or refused connection is the
  prefill server's, so the request is decoded locally from scratch instead.
- `GET /metrics`: the decode server's metrics followed by the sidecar's, because the
  EPP scrapes the pool's endpoints (this port) for queue and KV-cache load. If the
  decode server does not answer, neither does this (502), so the EPP sees it as down.
- `GET /sidecar/metrics`: the sidecar's metrics alone.

A client that goes away cancels the handler (aiohttp `handler_cancellation`), which
closes the upstream connection, so the model server stops generating for nobody.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from epp.errors import EppError
from epp.headers import ENCODER_HOSTS_PORTS, PREFILLER_HOST_PORT, REQUEST_ID
from epp.logsafe import clip
from epp.request import valid_request_id
from epp.sidecar import protocol as p
from epp.sidecar.allowlist import Allowlist
from epp.sidecar.metrics import SidecarMetrics

log = logging.getLogger("epp.sidecar")

OWN_METRICS_PATH = "/sidecar/metrics"
_METRICS_ACCEPT = "text/plain;version=0.0.4"
_perf = time.perf_counter


@dataclass(frozen=True)
class SidecarOptions:
    decode_url: str
    host: str = "0.0.0.0"
    port: int = 8000
    allow: tuple[str, ...] = ()
    allow_from_endpoints: str | None = None
    # llm-d sets no timeouts (long prompts prefill for long); a bound lets a hung
    # prefill server fall back to a local decode instead of holding the request.
    prefill_timeout: float = 60.0
    connect_timeout: float = 10.0
    max_body_bytes: int = 64 * 1024**2


@dataclass(frozen=True, slots=True)
class _Prefilled:
    kv_transfer_params: dict[str, Any]
    cached_tokens: int | None


@dataclass(frozen=True, slots=True)
class _Rejected:
    status: int
    headers: list[tuple[str, str]]
    body: bytes


@dataclass(frozen=True, slots=True)
class _Failed:
    reason: str


class Sidecar:
    """`await start()`, serve on `.port` (0 binds a free one), `await stop()`."""

    def __init__(self, options: SidecarOptions) -> None:
        self.options = options
        self.decode_url = options.decode_url.rstrip("/")
        self.allowlist = Allowlist(options.allow, options.allow_from_endpoints)
        self.metrics = SidecarMetrics()
        self.port = options.port
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.options.host in ("0.0.0.0", "") else self.options.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    @property
    def hostport(self) -> str:
        return self.url.removeprefix("http://")

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.options.connect_timeout),
            auto_decompress=False,  # bytes pass through as the server encoded them
        )
        app = web.Application(client_max_size=self.options.max_body_bytes)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.options.host, self.options.port)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> Sidecar:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ---- dispatch -------------------------------------------------------------
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "GET" and request.path == "/metrics":
            return await self._merged_metrics()
        if request.method == "GET" and request.path == OWN_METRICS_PATH:
            return web.Response(body=self.metrics.render(), content_type="text/plain")
        body = await request.read()
        label = p.path_label(request.path)
        headers = p.upstream_headers(request.headers.items())
        encoders = request.headers.get(ENCODER_HOSTS_PORTS)
        encode_api = p.encode_api(request.method, request.path)
        if encoders and encode_api is not None:
            await self._encode(request, body, headers, encode_api, encoders)
        api = p.pd_api(request.method, request.path)
        target = p.first_prefiller(request.headers.get(PREFILLER_HOST_PORT))
        if api is None or target is None:
            return await self._decode(request, body, headers, label, "forwarded")
        allowed = self.allowlist.resolve(target)
        if allowed is None:
            self.metrics.count(label, "forbidden")
            log.warning("refused prefill server %s: not in the allowlist", clip(target))
            return _error(
                403,
                f"prefill server {clip(target, 100)!r} (header {PREFILLER_HOST_PORT}) is not "
                f"in this sidecar's allowlist (--allow / --allow-from-endpoints: "
                f"{self.allowlist.describe()})",
                "prefiller_not_allowed",
            )
        try:
            parsed = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            parsed = None
        if not isinstance(parsed, dict):  # the decode server explains what is wrong
            return await self._decode(request, body, headers, label, "forwarded")
        return await self._remote_prefill(request, body, parsed, headers, api, allowed, label)

    async def _remote_prefill(
        self,
        request: web.Request,
        raw: bytes,
        body: dict[str, Any],
        headers: list[tuple[str, str]],
        api: str,
        target: str,
        label: str,
    ) -> web.StreamResponse:
        rid = valid_request_id(request.headers.get(REQUEST_ID)) or str(uuid.uuid4())
        headers = [(k, v) for k, v in headers if k.lower() != REQUEST_ID]
        headers.append((REQUEST_ID, rid))
        result = await self._prefill(target, request.path_qs, p.prefill_body(body, api), headers)
        if isinstance(result, _Rejected):
            self.metrics.count(label, "prefill_rejected")
            return web.Response(status=result.status, headers=result.headers, body=result.body)
        if isinstance(result, _Failed):
            log.warning("request %s: %s; decoding locally", rid, result.reason)
            return await self._decode(request, raw, headers, label, "prefill_fallback")
        decode = json.dumps(p.decode_body(body, result.kv_transfer_params)).encode()
        return await self._decode(
            request, decode, headers, label, "prefill_decode", result.cached_tokens
        )

    # ---- legs -------------------------------------------------------------------
    async def _encode(
        self,
        request: web.Request,
        raw: bytes,
        headers: list[tuple[str, str]],
        api: str,
        encoders: str,
    ) -> None:
        """The encode leg: the request, asking for one token, to the first encoder named,
        so its media is in that encoder's cache when prefill asks for it. Any failure
        (not allowlisted, refused, an error answer) only costs the encode: the request
        goes on and its media is encoded where it is prefilled."""
        assert self._session is not None
        target = p.first_prefiller(encoders)
        allowed = self.allowlist.resolve(target) if target else None
        if allowed is None:
            self.metrics.encodes.labels("forbidden").inc()
            log.warning("refused encode server %s: not in the allowlist", clip(encoders))
            return
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            return  # the decode server explains what is wrong
        if not isinstance(body, dict):
            return
        data = json.dumps(p.encode_body(body, api)).encode()
        timeout = aiohttp.ClientTimeout(
            total=self.options.prefill_timeout, sock_connect=self.options.connect_timeout
        )
        try:
            async with self._session.post(
                f"http://{allowed}{request.path_qs}",
                data=data,
                headers=_json_headers(headers),
                timeout=timeout,
            ) as r:
                await r.read()
                status = r.status
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            log.warning("encode server %s failed: %s %s", allowed, type(e).__name__, e)
            self.metrics.encodes.labels("failed").inc()
            return
        self.metrics.encodes.labels("encoded" if 200 <= status < 300 else "failed").inc()

    async def _prefill(
        self, target: str, path_qs: str, body: dict[str, Any], headers: list[tuple[str, str]]
    ) -> _Prefilled | _Rejected | _Failed:
        assert self._session is not None
        url = f"http://{target}{path_qs}"
        timeout = aiohttp.ClientTimeout(
            total=self.options.prefill_timeout, sock_connect=self.options.connect_timeout
        )
        t0 = _perf()
        try:
            async with self._session.post(
                url, data=json.dumps(body).encode(), headers=_json_headers(headers), timeout=timeout
            ) as r:
                raw = await r.read()
                status, resp_headers = r.status, list(r.headers.items())
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            return _Failed(f"prefill server {target} failed: {type(e).__name__} {e}".rstrip())
        finally:
            self.metrics.prefill_seconds.observe(_perf() - t0)
        if 400 <= status < 500:
            return _Rejected(status, p.downstream_headers(resp_headers, keep_length=False), raw)
        if not 200 <= status < 300:
            return _Failed(f"prefill server {target} answered {status}")
        try:
            answer = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            return _Failed(f"prefill server {target} answered non-JSON")
        params = answer.get("kv_transfer_params") if isinstance(answer, dict) else None
        if not isinstance(params, dict):
            return _Failed(f"prefill server {target} returned no kv_transfer_params")
        return _Prefilled(params, p.cached_tokens(answer))

    async def _decode(
        self,
        request: web.Request,
        body: bytes,
        headers: list[tuple[str, str]],
        label: str,
        outcome: str,
        cached_tokens: int | None = None,
    ) -> web.StreamResponse:
        """Send `body` to the local decode server and relay its answer as it comes.

        After a remote prefill (`cached_tokens` not None) the usage's cached_tokens is
        rewritten, in the JSON body or in the SSE usage chunk.
        """
        assert self._session is not None
        mode = "pd" if outcome == "prefill_decode" else "local"
        rewrite = cached_tokens is not None
        if rewrite:
            # Rewriting needs plain bytes; vLLM does not compress, but a client may ask.
            headers = [(k, v) for k, v in headers if k.lower() != "accept-encoding"]
        url = self.decode_url + request.path_qs
        t0 = _perf()
        resp: web.StreamResponse | None = None
        try:
            async with self._session.request(
                request.method, url, data=body, headers=headers, skip_auto_headers=_NO_AUTO
            ) as up:
                self.metrics.decode_first_byte_seconds.labels(mode).observe(_perf() - t0)
                sse = up.content_type == "text/event-stream"
                encoded = up.headers.get("content-encoding", "identity") != "identity"
                rewrite = rewrite and not encoded
                if rewrite and not sse:
                    data = p.rewrite_json_usage(await up.read(), cached_tokens)  # type: ignore[arg-type]
                    out = p.downstream_headers(up.headers.items(), keep_length=False)
                    resp = web.Response(status=up.status, reason=up.reason, headers=out, body=data)
                else:
                    resp = web.StreamResponse(
                        status=up.status,
                        reason=up.reason,
                        headers=p.downstream_headers(up.headers.items(), keep_length=not rewrite),
                    )
                    await resp.prepare(request)
                    await _pump(up, resp, p.SseUsageRewriter(cached_tokens) if rewrite else None)  # type: ignore[arg-type]
        except _ClientGone:
            outcome = "client_gone"
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            if resp is None or not resp.prepared:
                self.metrics.count(label, "decode_error")
                return _error(
                    502,
                    f"decode server {self.decode_url} failed: {type(e).__name__} {e}".rstrip(),
                    "decode_unavailable",
                )
            # Mid-stream: the status is sent; cutting the connection is the only signal.
            log.warning("decode stream from %s broke: %s", self.decode_url, e)
            outcome = "decode_error"
            if request.transport is not None:
                request.transport.close()
        self.metrics.decode_seconds.labels(mode).observe(_perf() - t0)
        self.metrics.count(label, outcome)
        return resp

    async def _merged_metrics(self) -> web.Response:
        assert self._session is not None
        own = self.metrics.render()
        try:
            async with self._session.get(
                self.decode_url + "/metrics",
                headers={"accept": _METRICS_ACCEPT, "accept-encoding": "identity"},
                timeout=aiohttp.ClientTimeout(total=5),
            ) as r:
                text, status = await r.read(), r.status
                content_type = r.headers.get("content-type", "text/plain; version=0.0.4")
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            return web.Response(status=502, text=f"decode server /metrics failed: {e}\n")
        if status != 200:
            return web.Response(status=status, body=text)
        body = text if text.endswith(b"\n") or not text else text + b"\n"
        return web.Response(body=body + own, headers={"content-type": content_type})


class _ClientGone(Exception):
    """The client closed its connection while the answer was being relayed."""


async def _pump(
    up: aiohttp.ClientResponse, resp: web.StreamResponse, rewriter: p.SseUsageRewriter | None
) -> None:
    """Relay the body chunk by chunk as it arrives (SSE included)."""

    async def write(data: bytes) -> None:
        if not data:
            return
        try:
            await resp.write(data)
        except ConnectionResetError:
            raise _ClientGone from None

    async for chunk in up.content.iter_any():
        await write(rewriter.feed(chunk) if rewriter is not None else chunk)
    if rewriter is not None:
        await write(rewriter.flush())
    try:
        await resp.write_eof()
    except ConnectionResetError:
        raise _ClientGone from None


# The client adds these unless told not to; a proxy sends only what the client sent.
_NO_AUTO = frozenset({"Accept", "Accept-Encoding", "User-Agent"})


def _json_headers(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The prefill leg's headers: a JSON body, and an uncompressed answer to parse."""
    drop = {"content-type", "accept-encoding"}
    kept = [(k, v) for k, v in headers if k.lower() not in drop]
    return [*kept, ("content-type", "application/json"), ("accept-encoding", "identity")]


def _error(status: int, message: str, code: str) -> web.Response:
    return web.Response(
        status=status, body=EppError(status, message, code).body(), content_type="application/json"
    )
