"""One simulated vLLM server: an aiohttp app in front of an `Engine`.

Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models,
POST /v1/load_lora_adapter, POST /v1/unload_lora_adapter, GET /kv_event_sources,
POST /reset_prefix_cache, GET /health, GET /metrics, GET|POST /admin. Every response
carries `x-sim-server: <name>` so a test behind a proxy can tell which replica answered
without the body leaving OpenAI's shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from aiohttp import web

from epp.headers import SIM_SERVER
from epp.sim import pd
from epp.sim.chat import load_renderer
from epp.sim.clock import ModelClock
from epp.sim.config import Faults, SimConfig
from epp.sim.engine import Engine, EngineSnapshot
from epp.sim.kv_events import KVEventPublisher, format_topic, replica_endpoint
from epp.sim.kvcache import KVEvent
from epp.sim.lora import LoraError, LoraRegistry
from epp.sim.metrics import CONTENT_TYPE, SimMetrics
from epp.sim.openai import (
    ApiError,
    InferenceRequest,
    Kind,
    ResponseBuilder,
    error_body,
    models_body,
    parse,
    usage,
)
from epp.sim.sequence import Channel, SimRequest, State
from epp.sim.tokenizer import filler_ids, filler_text, filler_token, shared_tokenizer

log = logging.getLogger("epp.sim")


# How often (real seconds) the server checks whether waiting clients have gone, and a
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
    cached_tokens: int = 0
    metrics_scrapes: int = 0
    metrics_hung: int = 0
    # Requests by the kind of `kv_transfer_params` they carried, honoured or not:
    # do_remote_decode (prefill legs), do_remote_prefill (decode legs), other (neither).
    kv_transfer: dict[str, int] = field(
        default_factory=lambda: {"do_remote_decode": 0, "do_remote_prefill": 0, "other": 0}
    )


class SimServer:
    """A simulator on its own port. `port=0` binds a free port; read `.port` after
    `start()`. Faults can be changed at any time through `.faults` or `set_faults`.
    `replica` is the server's index in a cluster: a bound KV-events endpoint is
    offset by it, as vLLM offsets it by data-parallel rank."""

    def __init__(
        self,
        name: str = "sim-0",
        config: SimConfig | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        replica: int = 0,
    ) -> None:
        self.name = name
        self.config = config or SimConfig()
        self.host = host
        self.port = port
        self.replica = replica
        self.engine_id = str(uuid.uuid4())
        self.faults = Faults(fail_rate=self.config.failure_rate)
        self.stats = ServerStats()
        self.clock = ModelClock(self.config.time_scale)
        self.tokenizer = shared_tokenizer(self.config.tokenizer)
        self.render = load_renderer(self.config.chat_template)
        self.lora = LoraRegistry(self.config.lora_modules, self.config.max_loras)
        self.metrics = SimMetrics(self.config, self._reported_load)
        events = self.config.kv_events
        self.publisher: KVEventPublisher | None = None
        self.engine = Engine(
            self.config,
            self.clock,
            self.metrics,
            lora=self.lora,
            output_ids=filler_ids(self.tokenizer),
            publish=self._publish if events is not None and events.enabled else None,
        )
        # String seeds hash deterministically: replicas differ, runs repeat.
        self._rng = random.Random(f"{self.config.seed}:{name}")
        self._runner: web.AppRunner | None = None
        self._reaper: asyncio.Task[None] | None = None
        self._inflight: dict[Channel, web.Request] = {}
        self._stopping = False

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def advertised_host(self) -> str:
        """The address peers should use: a wildcard bind is reached on loopback."""
        return "127.0.0.1" if self.host in ("", "0.0.0.0", "::") else self.host

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

    def _publish(self, events: list[KVEvent]) -> None:
        if self.publisher is not None:
            self.publisher.publish(events)

    # -- lifecycle -------------------------------------------------------------

    def build_app(self) -> web.Application:
        app = web.Application(middlewares=[self._errors], client_max_size=64 * 1024**2)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/load_lora_adapter", self._load_lora)
        app.router.add_post("/v1/unload_lora_adapter", self._unload_lora)
        app.router.add_get("/kv_event_sources", self._kv_event_sources)
        app.router.add_post("/reset_prefix_cache", self._reset_prefix_cache)
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
        events = self.config.kv_events
        if events is not None and events.enabled:
            host = self.advertised_host
            self.publisher = KVEventPublisher(
                events,
                endpoint=replica_endpoint(events.endpoint, self.replica),
                topic=format_topic(events.topic, host, self.port, self.config.model),
                fmt=self.config.kv_events_format,
                advertised_host=self.advertised_host,
            )
        self._reaper = asyncio.get_running_loop().create_task(self._reap(), name="sim-reaper")

    async def stop(self) -> None:
        self._stopping = True
        await self.engine.stop()
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
            self._reaper = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.publisher is not None:
            self.publisher.close()
            self.publisher = None

    async def __aenter__(self) -> SimServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _reap(self) -> None:
        """Fail the wait of every handler whose client has gone, so its requests stop
        holding a slot (one timer per server instead of one per waiting handler)."""
        while True:
            await asyncio.sleep(_POLL)
            for channel, request in list(self._inflight.items()):
                transport = request.transport
                if transport is None or transport.is_closing():
                    channel.fail(ConnectionResetError("client disconnected"))

    # -- plumbing --------------------------------------------------------------

    async def _tag_response(self, request: web.Request, response: web.StreamResponse) -> None:
        response.headers[SIM_SERVER] = self.name

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

    def _served(self) -> set[str]:
        return {self.config.model, *self.lora.names()}

    # -- inference ---------------------------------------------------------------

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._inference(request, "completion")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._inference(request, "chat")

    def _count_kv_transfer(self, kind: pd.Kind) -> None:
        if kind != "none":
            self.stats.kv_transfer[kind] += 1

    async def _inference(self, request: web.Request, kind: Kind) -> web.StreamResponse:
        self.stats.requests_received += 1
        req = parse(
            kind,
            await self._json(request),
            self.config,
            tokenizer=self.tokenizer,
            render=self.render,
            models=self._served(),
        )
        self._count_kv_transfer(req.kv_kind)
        if self._stopping:
            raise ApiError(503, "server is shutting down")
        if self.faults.fail_rate > 0 and self._rng.random() < self.faults.fail_rate:
            self.stats.requests_failed += 1
            raise ApiError(500, "simulated failure (fault injection)")

        role = self.config.kv_role
        remote_decode = req.kv_kind == "do_remote_decode" and pd.honours(role, req.kv_kind)
        remote_prefill = req.kv_kind == "do_remote_prefill" and pd.honours(role, req.kv_kind)
        channel = Channel(stream=req.stream)
        seqs = [
            SimRequest(
                ids,
                1 if remote_decode else req.max_tokens,
                channel,
                model=req.model,
                lora=req.lora,
                index=i,
                finish_reason="length" if remote_decode else req.finish_reason,
                cache_salt=req.cache_salt,
                remote_prefill=remote_prefill,
                remote_decode=remote_decode,
            )
            for i, ids in enumerate(req.prompts)
        ]
        delay = self.faults.delay_ms / 1000.0
        for seq in seqs:
            self.engine.submit(seq, delay)
        builder = ResponseBuilder(kind, req.model)
        self._inflight[channel] = request
        try:
            if req.stream:
                return await self._stream(request, builder, seqs, req.include_usage)
            return await self._complete(builder, req, seqs, remote_decode)
        except ConnectionResetError:
            self.stats.requests_aborted += 1
            return web.Response(status=499)  # nobody is listening; nginx's "client closed"
        finally:
            self._inflight.pop(channel, None)
            for seq in seqs:  # no-op for finished ones; frees slots if the client left
                self.engine.abort(seq)

    def _usage(self, seqs: list[SimRequest]) -> dict[str, Any]:
        return usage(
            sum(s.num_prompt_tokens for s in seqs),
            sum(s.generated for s in seqs),
            sum(s.num_cached_tokens for s in seqs),
        )

    def _count_success(self, seqs: list[SimRequest]) -> None:
        self.stats.requests_succeeded += 1
        self.stats.prompt_tokens += sum(s.num_prompt_tokens for s in seqs)
        self.stats.completion_tokens += sum(s.generated for s in seqs)
        self.stats.cached_tokens += sum(s.num_cached_tokens for s in seqs)

    def _aborted(self, seqs: list[SimRequest]) -> SimRequest | None:
        return next((s for s in seqs if s.state is State.ABORTED), None)

    async def _complete(
        self,
        builder: ResponseBuilder,
        req: InferenceRequest,
        seqs: list[SimRequest],
        remote_decode: bool,
    ) -> web.Response:
        channel = seqs[0].channel
        while True:
            aborted = self._aborted(seqs)
            if aborted is not None:
                self.stats.requests_aborted += 1
                raise ApiError(503, aborted.abort_reason)
            if all(s.state is State.FINISHED for s in seqs):
                break
            await channel.wait()
        self._count_success(seqs)
        params = None
        if remote_decode:
            params = pd.prefill_answer(
                self.engine_id, seqs[0].remote_block_ids, self.advertised_host, self.port
            )
        texts = [filler_text(s.generated) for s in seqs]
        finishes = [s.finish_reason for s in seqs]
        return web.json_response(builder.full(texts, finishes, self._usage(seqs), params))

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

        channel = seqs[0].channel
        sent = [0] * len(seqs)
        remaining = len(seqs)
        try:
            while remaining:
                out: list[str] = []
                for i, seq in enumerate(seqs):
                    finished = seq.state is State.FINISHED
                    while sent[i] < seq.generated:
                        k = sent[i]
                        last = finished and k + 1 == seq.generated
                        reason = seq.finish_reason if last else None
                        chunk = builder.chunk_json(i, filler_token(k), k == 0, reason)
                        out.append(f"data: {chunk}\n\n")
                        sent[i] += 1
                        remaining -= last
                if out:
                    await resp.write("".join(out).encode())
                aborted = self._aborted(seqs)
                if aborted is not None:
                    self.stats.requests_aborted += 1
                    await send(error_body(503, aborted.abort_reason))
                    await send("[DONE]")
                    return resp
                if remaining:
                    await channel.wait()
            if include_usage:
                await send(builder.usage_chunk(self._usage(seqs)))
            await send("[DONE]")
            await resp.write_eof()
        except ConnectionResetError:
            self.stats.requests_aborted += 1
            return resp
        self._count_success(seqs)
        return resp

    # -- LoRA ----------------------------------------------------------------------

    async def _models(self, request: web.Request) -> web.Response:
        adapters = {a.name: a.path for a in self.lora.adapters.values()}
        return web.json_response(models_body(self.config, adapters))

    async def _load_lora(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        name = body.get("lora_name") if isinstance(body, dict) else None
        path = body.get("lora_path") if isinstance(body, dict) else None
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
            raise ApiError(400, "Both 'lora_name' and 'lora_path' must be provided.")
        if name == self.config.model:
            raise ApiError(400, f"The lora adapter '{name}' has already been loaded.")
        try:
            message = self.lora.load(name, path)
        except LoraError as e:
            raise ApiError(e.status, e.message) from None
        log.info("%s: %s", self.name, message)
        return web.Response(text=message)

    async def _unload_lora(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        name = body.get("lora_name") if isinstance(body, dict) else None
        if not isinstance(name, str) or not name:
            raise ApiError(400, "'lora_name' needs to be provided to unload a LoRA adapter.")
        try:
            message = self.lora.unload(name)
        except LoraError as e:
            raise ApiError(e.status, e.message) from None
        log.info("%s: %s", self.name, message)
        return web.Response(text=message)

    # -- KV cache --------------------------------------------------------------------

    async def _kv_event_sources(self, request: web.Request) -> web.Response:
        sources = [self.publisher.source()] if self.publisher is not None else []
        return web.json_response(sources)

    async def _reset_prefix_cache(self, request: web.Request) -> web.Response:
        if not self.engine.reset_prefix_cache():
            log.warning("%s: prefix cache not reset: blocks are in use", self.name)
        return web.Response()

    # -- the rest ----------------------------------------------------------------

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
        sched = self.engine.scheduler.stats
        kv = self.engine.kv
        publisher = self.publisher
        return {
            "name": self.name,
            "url": self.url,
            "model": self.config.model,
            "preset": self.config.preset,
            "kv_role": self.config.kv_role,
            "faults": self.faults.to_dict(),
            "stats": asdict(self.stats),
            "engine": {
                "running": snap.running,
                "waiting": snap.waiting,
                "kv_cache_usage": snap.kv_usage,
                "steps": sched.steps,
                "max_running_seen": sched.max_running_seen,
                "max_batched_tokens_seen": sched.max_batched_tokens_seen,
                "preemptions": sched.preemptions,
                "prefix_cache_queries": sched.prefix_cache_queries,
                "prefix_cache_hits": sched.prefix_cache_hits,
                "num_gpu_blocks": kv.num_blocks,
                "blocks_in_use": kv.num_used_blocks,
                "blocks_cached": kv.num_cached_blocks,
                "evictions": kv.evictions,
                "lora_loads": sched.lora_loads,
                "lora_resident": self.lora.resident,
            },
            "kv_events": None
            if publisher is None
            else {**publisher.source(), "sent": publisher.sent, "dropped": publisher.dropped},
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
