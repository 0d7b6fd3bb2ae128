"""One simulated vLLM server: an aiohttp app in front of an `Engine`.

Routes, by family: `openai_routes` (POST /v1/completions, POST /v1/chat/completions,
GET /v1/models), `render_routes` (POST /v1/completions/render,
/v1/chat/completions/render: token ids only), `admin_routes` (POST
/v1/load_lora_adapter, /v1/unload_lora_adapter, GET /kv_event_sources, POST
/reset_prefix_cache, GET|POST /admin) and `probe_routes` (GET /health, GET /metrics);
this module holds the server's state and lifecycle. Every response carries
`x-sim-server: <name>` so a test behind a proxy can tell which replica answered without
the body leaving OpenAI's shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

from aiohttp import web

from epp.headers import SIM_DP_RANK, SIM_SERVER, SIM_TRACEPARENT
from epp.sim.admin_routes import AdminRoutes
from epp.sim.chat import load_renderer
from epp.sim.clock import ModelClock
from epp.sim.config import Faults, SimConfig
from epp.sim.dp import RankChoiceError, RankChooser, render_ranks
from epp.sim.encode import Encoder
from epp.sim.engine import Engine, EngineSnapshot
from epp.sim.kv_events import KVEventPublisher, format_topic, replica_endpoint
from epp.sim.kvcache import KVEvent
from epp.sim.lora import LoraRegistry
from epp.sim.metrics import SimMetrics
from epp.sim.openai import (
    ApiError,
)
from epp.sim.openai_routes import OpenAIRoutes
from epp.sim.probe_routes import POLL_SECONDS, ProbeRoutes
from epp.sim.render_routes import RenderRoutes
from epp.sim.sequence import Channel
from epp.sim.tokenizer import filler_ids, shared_tokenizer

log = logging.getLogger("epp.sim")
_DP_RANK = web.RequestKey("dp_rank", int)


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
    # Encode role: media items encoded, and items found in the encoder cache.
    mm_items_encoded: int = 0
    encoder_cache_hits: int = 0


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
        self.encoder = Encoder(
            self.clock, self.config.encode_ms_per_item, self.config.encoder_cache_items
        )
        self.tokenizer = shared_tokenizer(self.config.tokenizer)
        self.render = load_renderer(self.config.chat_template)
        self.lora = LoraRegistry(self.config.lora_modules, self.config.max_loras)
        events = self.config.kv_events
        publishing = events is not None and events.enabled
        # One engine per data-parallel rank (one for a plain server), each with its own
        # metrics and KV-event publisher; `engine`/`metrics`/`publisher` are rank 0's.
        self.engines: list[Engine] = []
        self.rank_metrics: list[SimMetrics] = []
        self.publishers: list[KVEventPublisher | None] = []
        for rank in range(self.config.data_parallel_size):
            metrics = SimMetrics(self.config, partial(self._reported_load, rank), str(rank))
            self.rank_metrics.append(metrics)
            self.publishers.append(None)
            self.engines.append(
                Engine(
                    self.config,
                    self.clock,
                    metrics,
                    lora=self.lora,
                    output_ids=filler_ids(self.tokenizer),
                    publish=partial(self._publish, rank) if publishing else None,
                )
            )
        self.metrics = self.rank_metrics[0]
        self.engine = self.engines[0]
        self.ranks = RankChooser([e.snapshot for e in self.engines])
        # String seeds hash deterministically: replicas differ, runs repeat.
        self.rng = random.Random(f"{self.config.seed}:{name}")
        self._runner: web.AppRunner | None = None
        self._reaper: asyncio.Task[None] | None = None
        self.inflight: dict[Channel, web.Request] = {}
        self.stopping = False

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

    @property
    def publisher(self) -> KVEventPublisher | None:
        return self.publishers[0]

    def engine_for(self, request: web.Request) -> Engine:
        """The rank a request runs on (`X-data-parallel-rank`, else least loaded)."""
        try:
            rank = self.ranks.choose(request.headers)
        except RankChoiceError as e:
            raise ApiError(400, str(e)) from None
        request[_DP_RANK] = rank
        return self.engines[rank]

    def render_metrics(self) -> bytes:
        return render_ranks([m.registry for m in self.rank_metrics])

    def _reported_load(self, rank: int = 0) -> EngineSnapshot:
        snap = self.engines[rank].snapshot()
        if self.faults.fixed_queue is not None:
            snap = EngineSnapshot(
                snap.running,
                self.faults.fixed_queue,
                snap.kv_usage,
                snap.running_models,
                snap.waiting_models,
            )
        return snap

    def _publish(self, rank: int, events: list[KVEvent]) -> None:
        publisher = self.publishers[rank]
        if publisher is not None:
            publisher.publish(events)

    # -- lifecycle -------------------------------------------------------------

    def build_app(self) -> web.Application:
        app = web.Application(middlewares=[self._errors], client_max_size=64 * 1024**2)
        for routes in (
            OpenAIRoutes(self),
            RenderRoutes(self),
            AdminRoutes(self),
            ProbeRoutes(self),
        ):
            routes.register(app.router)
        app.on_response_prepare.append(self._tag_response)
        return app

    async def start(self) -> None:
        for engine in self.engines:
            engine.start()
        # A short shutdown timeout: stop() has already ended every stream. A client that
        # disconnects cancels its handler, so a non-streamed request is aborted too, as
        # vLLM's `with_cancellation` routes do (vllm/entrypoints/utils.py): an EPP that
        # evicts a request, or a client that gives up, frees its slot at once.
        self._runner = web.AppRunner(
            self.build_app(), access_log=None, shutdown_timeout=1.0, handler_cancellation=True
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        events = self.config.kv_events
        if events is not None and events.enabled:
            host = self.advertised_host
            size = self.config.data_parallel_size
            for rank in range(size):
                # a bound endpoint's port is offset by the rank, as vLLM does
                self.publishers[rank] = KVEventPublisher(
                    events,
                    endpoint=replica_endpoint(events.endpoint, self.replica * size + rank),
                    topic=format_topic(events.topic, host, self.port, self.config.model),
                    fmt=self.config.kv_events_format,
                    advertised_host=self.advertised_host,
                    dp_rank=rank,
                )
        self._reaper = asyncio.get_running_loop().create_task(self._reap(), name="sim-reaper")

    async def stop(self) -> None:
        self.stopping = True
        for engine in self.engines:
            await engine.stop()
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
            self._reaper = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        for rank, publisher in enumerate(self.publishers):
            if publisher is not None:
                publisher.close()
                self.publishers[rank] = None

    async def __aenter__(self) -> SimServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _reap(self) -> None:
        """Fail the wait of every handler whose client has gone, so its requests stop
        holding a slot (one timer per server instead of one per waiting handler)."""
        while True:
            await asyncio.sleep(POLL_SECONDS)
            for channel, request in list(self.inflight.items()):
                transport = request.transport
                if transport is None or transport.is_closing():
                    channel.fail(ConnectionResetError("client disconnected"))

    # -- plumbing --------------------------------------------------------------

    async def _tag_response(self, request: web.Request, response: web.StreamResponse) -> None:
        response.headers[SIM_SERVER] = self.name
        if len(self.engines) > 1 and _DP_RANK in request:
            response.headers[SIM_DP_RANK] = str(request[_DP_RANK])
        # The W3C trace context the request came with, which a tracing vLLM continues
        # (--otlp-traces-endpoint): echoed so a test can see what reached the server.
        parent = request.headers.get("traceparent")
        if parent is not None:
            response.headers[SIM_TRACEPARENT] = parent

    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as e:
            if e.status < 500:
                self.stats.requests_rejected += 1
            return web.json_response(e.body(), status=e.status)

    def served_models(self) -> set[str]:
        return {self.config.model, *self.lora.names()}

    # -- inference ---------------------------------------------------------------

    # -- LoRA ----------------------------------------------------------------------

    # -- KV cache --------------------------------------------------------------------

    # -- the rest ----------------------------------------------------------------

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
            "ec_role": self.config.ec_role,
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
