"""One simulated vLLM server: an aiohttp app in front of an `Engine`.

Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health,
GET /metrics, GET|POST /admin. Every response carries `x-sim-server: <name>` so a test
behind a proxy can tell which replica answered without the body leaving OpenAI's shape.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from dataclasses import asdict, dataclass
from typing import Any

from aiohttp import web

from epp.sim.clock import ModelClock
from epp.sim.config import Faults, SimConfig
from epp.sim.engine import Aborted, Engine, EngineSnapshot, SimRequest, Token
from epp.sim.metrics import CONTENT_TYPE, SimMetrics
from epp.sim.openai import ApiError, Kind, ResponseBuilder, error_body, models_body, parse, usage
from epp.sim.tokenizer import filler_token

log = logging.getLogger("epp.sim")

SERVER_HEADER = "x-sim-server"

# How often (real seconds) a waiting handler checks whether its client has gone, and a
# hung /metrics whether it may answer after all.
_POLL = 0.05


@dataclass
class ServerStats:
    """Counters for `GET /admin`, so tests can see which replica did what."""

    requests_received: int = 0
    requests_succeeded: int = 0
    requests_failed: int = 0  # injected 500s
    requests_rejected: int = 0  # 4xx
    requests_aborted: int = 0  # client gone or server stopping
    prompt_tokens: int = 0
    completion_tokens: int = 0
    metrics_scrapes: int = 0
    metrics_hung: int = 0


class SimServer:
    """A simulator on its own port. `port=0` binds a free port; read `.port` after
    `start()`. Faults can be changed at any time through `.faults` or `set_faults`."""

    def __init__(
        self,
        name: str = "sim-0",
        config: SimConfig | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.name = name
        self.config = config or SimConfig()
        self.host = host
        self.port = port
        self.faults = Faults(fail_rate=self.config.failure_rate)
        self.stats = ServerStats()
        self.clock = ModelClock(self.config.time_scale)
        self.metrics = SimMetrics(self.config, self._reported_load)
        self.engine = Engine(self.config, self.clock, self.metrics)
        # String seeds hash deterministically: replicas differ, runs repeat.
        self._rng = random.Random(f"{self.config.seed}:{name}")
        self._runner: web.AppRunner | None = None
        self._stopping = False

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def set_faults(self, **changes: Any) -> None:
        self.faults.update(changes)

    def _reported_load(self) -> EngineSnapshot:
        snap = self.engine.snapshot()
        if self.faults.fixed_queue is not None:
            snap = EngineSnapshot(
                snap.running,
                self.faults.fixed_queue,
                snap.kv_usage,
                snap.running_models,
                snap.waiting_models,
            )
        return snap

    # -- lifecycle -------------------------------------------------------------

    def build_app(self) -> web.Application:
        app = web.Application(middlewares=[self._errors], client_max_size=64 * 1024**2)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/admin", self._admin_get)
        app.router.add_post("/admin", self._admin_post)
        app.on_response_prepare.append(self._tag_response)
        return app

    async def start(self) -> None:
        self.engine.start()
        # A short shutdown timeout: stop() has already ended every stream.
        self._runner = web.AppRunner(self.build_app(), access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        self._stopping = True
        await self.engine.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> SimServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- plumbing --------------------------------------------------------------

    async def _tag_response(self, request: web.Request, response: web.StreamResponse) -> None:
        response.headers[SERVER_HEADER] = self.name

    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as e:
            if e.status < 500:
                self.stats.requests_rejected += 1
            return web.json_response(e.body(), status=e.status)

    @staticmethod
    async def _json(request: web.Request) -> Any:
        try:
            return json.loads(await request.read())
        except (ValueError, UnicodeDecodeError) as e:
            raise ApiError(400, f"Invalid JSON body: {e}") from None

    # -- inference ---------------------------------------------------------------

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._inference(request, "completion")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._inference(request, "chat")

    async def _inference(self, request: web.Request, kind: Kind) -> web.StreamResponse:
        self.stats.requests_received += 1
        req = parse(kind, await self._json(request), self.config)
        if self._stopping:
            raise ApiError(503, "server is shutting down")
        if self.faults.fail_rate > 0 and self._rng.random() < self.faults.fail_rate:
            self.stats.requests_failed += 1
            raise ApiError(500, "simulated failure (fault injection)")

        sink: asyncio.Queue[Token | Aborted] = asyncio.Queue()
        seqs = [
            SimRequest(n, req.max_tokens, sink, model=req.model, index=i,
                       finish_reason=req.finish_reason)
            for i, n in enumerate(req.prompt_tokens)
        ]  # fmt: skip
        delay = self.faults.delay_ms / 1000.0
        for seq in seqs:
            self.engine.submit(seq, delay)
        builder = ResponseBuilder(kind, req.model)
        try:
            if req.stream:
                return await self._stream(request, builder, seqs, req.include_usage)
            return await self._complete(request, builder, seqs)
        except ConnectionResetError:
            self.stats.requests_aborted += 1
            return web.Response(status=499)  # nobody is listening; nginx's "client closed"
        finally:
            for seq in seqs:  # no-op for finished ones; frees slots if the client left
                self.engine.abort(seq)

    @staticmethod
    async def _next(request: web.Request, sink: asyncio.Queue[Token | Aborted]) -> Token | Aborted:
        """The next engine event, or ConnectionResetError once the client has gone, so
        a request whose client gave up (a timeout, an EPP retry) stops holding a slot."""
        while True:
            try:
                return await asyncio.wait_for(sink.get(), _POLL)
            except TimeoutError:
                transport = request.transport
                if transport is None or transport.is_closing():
                    raise ConnectionResetError("client disconnected") from None

    def _usage(self, seqs: list[SimRequest]) -> dict[str, Any]:
        return usage(sum(s.prompt_tokens for s in seqs), sum(s.generated for s in seqs))

    def _count_success(self, seqs: list[SimRequest]) -> None:
        self.stats.requests_succeeded += 1
        self.stats.prompt_tokens += sum(s.prompt_tokens for s in seqs)
        self.stats.completion_tokens += sum(s.generated for s in seqs)

    async def _complete(
        self, request: web.Request, builder: ResponseBuilder, seqs: list[SimRequest]
    ) -> web.Response:
        texts = [""] * len(seqs)
        finishes = [""] * len(seqs)
        remaining = len(seqs)
        sink = seqs[0].sink
        while remaining:
            event = await self._next(request, sink)
            if isinstance(event, Aborted):
                self.stats.requests_aborted += 1
                raise ApiError(503, event.reason)
            i = event.request.index
            texts[i] += filler_token(event.index)
            if event.finish_reason is not None:
                finishes[i] = event.finish_reason
                remaining -= 1
        self._count_success(seqs)
        return web.json_response(builder.full(texts, finishes, self._usage(seqs)))

    async def _stream(
        self,
        request: web.Request,
        builder: ResponseBuilder,
        seqs: list[SimRequest],
        include_usage: bool,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)

        async def send(payload: Any) -> None:
            data = payload if isinstance(payload, str) else json.dumps(payload)
            await resp.write(f"data: {data}\n\n".encode())

        remaining = len(seqs)
        sink = seqs[0].sink
        try:
            while remaining:
                event = await self._next(request, sink)
                if isinstance(event, Aborted):
                    self.stats.requests_aborted += 1
                    await send(error_body(503, event.reason))
                    await send("[DONE]")
                    return resp
                text = filler_token(event.index)
                await send(
                    builder.chunk(event.request.index, text, event.index == 0, event.finish_reason)
                )
                if event.finish_reason is not None:
                    remaining -= 1
            if include_usage:
                await send(builder.usage_chunk(self._usage(seqs)))
            await send("[DONE]")
            await resp.write_eof()
        except ConnectionResetError:
            self.stats.requests_aborted += 1
            return resp
        self._count_success(seqs)
        return resp

    # -- the rest ----------------------------------------------------------------

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(models_body(self.config))

    async def _health(self, request: web.Request) -> web.Response:
        if not self.faults.healthy:
            return web.Response(status=503)
        return web.Response()

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        self.stats.metrics_scrapes += 1
        if not self.faults.metrics:
            self.stats.metrics_hung += 1
            # Never answer: the scraper must hit its own timeout, as with a wedged
            # server. Give up only if the client leaves, the server stops, or the
            # fault is lifted (then answer late, as a slow server would).
            while not self.faults.metrics:
                transport = request.transport
                if self._stopping or transport is None or transport.is_closing():
                    if transport is not None:
                        transport.close()
                    raise asyncio.CancelledError
                await asyncio.sleep(_POLL)
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    def admin_state(self) -> dict[str, Any]:
        snap = self.engine.snapshot()
        return {
            "name": self.name,
            "url": self.url,
            "model": self.config.model,
            "faults": self.faults.to_dict(),
            "stats": asdict(self.stats),
            "engine": {
                "running": snap.running,
                "waiting": snap.waiting,
                "kv_cache_usage": snap.kv_usage,
                "steps": self.engine.steps,
                "max_running_seen": self.engine.max_running_seen,
            },
        }

    async def _admin_get(self, request: web.Request) -> web.Response:
        return web.json_response(self.admin_state())

    async def _admin_post(self, request: web.Request) -> web.Response:
        changes = await self._json(request)
        if not isinstance(changes, dict):
            raise ApiError(400, "admin body must be a JSON object of faults")
        try:
            self.faults.update(changes)
        except ValueError as e:
            raise ApiError(400, str(e)) from None
        log.info("%s: faults now %s", self.name, self.faults.to_dict())
        return web.json_response(self.admin_state())
