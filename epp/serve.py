"""`epp serve`: the endpoint picker process.

Wires the pieces: endpoints (file and flags, or Kubernetes discovery) → datastore, the
metrics scraper filling it, the config's scheduler behind a director, the ext_proc and
health gRPC servers and the Prometheus /metrics endpoint. `EppServer` is the same thing
in-process, for tests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import json
import logging
import os
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from epp.admission import Admission, Objectives, load_objectives_file
from epp.body_budget import add_body_share_flags, body_shares_from_args
from epp.buildinfo import build_commit
from epp.completion import ResponseObserver
from epp.composition import install_plugins
from epp.config.errors import ConfigError
from epp.config.loader import LoadedConfig, load_config_file, load_default_config
from epp.datalayer import k8s_cli
from epp.datalayer.endpoints_file import (
    EndpointsError,
    load_endpoints_file,
    parse_endpoint_args,
    watch_endpoints_file,
)
from epp.datalayer.first_scrape import await_first_scrape
from epp.datalayer.k8s_discovery import (
    KubeConfigError,
    KubernetesDiscovery,
    KubeSource,
    load_api_client,
)
from epp.datalayer.k8s_pods import PoolSpecError
from epp.datalayer.loopclock import LoopClock
from epp.datalayer.scrape_thread import ScraperThread
from epp.datalayer.scraper import ScrapeConfig
from epp.datastore import Datastore, Endpoint
from epp.director import ColdStart, Director
from epp.election import cli as election_cli
from epp.election.base import Elector
from epp.extproc.handoff import RouteTable
from epp.extproc.server import (
    DEFAULT_BODY_TIMEOUT,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_BUFFERED_BYTES,
    StreamLimits,
    start_grpc_servers,
)
from epp.extproc.tls import ServerCert, TlsError, load_cert_dir, self_signed
from epp.flowcontrol.controller import FlowController
from epp.flowcontrol.metrics import register_flow_control
from epp.limits import BodyLimits, HeaderLimits
from epp.loop_tasks import update_loop_tasks
from epp.observability import REGISTRY, register_pool, set_build_info
from epp.planner.config import PlannerConfig, check_live, load_planner_file
from epp.planner.loop import (
    PlannerThread,
    Ticks,
    build_live_planner,
    start_live_planner,
    stop_live_planner,
)
from epp.scheduling.interfaces import Lifecycle
from epp.scheduling.registry import Handle, PluginImportError
from epp.status.ring import DecisionRing
from epp.status.routes import add_status_routes

if TYPE_CHECKING:
    from epp.planner.perf import Profile
    from epp.tracing import RequestTracer

log = logging.getLogger("epp")


DEFAULT_MAX_SCRAPE_INTERVAL = 1.0  # adaptive scraping's ceiling unless a flag says otherwise


@dataclass
class ServeOptions:
    host: str = "0.0.0.0"
    grpc_port: int = 9002
    health_port: int = 9003
    metrics_port: int = 9090
    limits: StreamLimits = field(default_factory=StreamLimits)
    # On SIGTERM: health NOT_SERVING, new streams refused, open ones get this long.
    drain_timeout: float = 30.0
    # Upstream's 50 ms while an endpoint's metrics change, backing off to 1 s while they
    # do not (epp/datalayer/scraper.py): an idle pool costs what a fixed 1 s does (-65 %
    # of the servers' scrape CPU, docs/BENCHMARKS.md "Scrape interval"), while a server
    # under changing load is still read every 50 ms, which the configs that score
    # scraped queues (load-only, prefix-weighted, precise) need. The default config
    # (sticky until saturated) takes its fast signal from the EPP's own in-flight counts.
    # 0 = upstream's fixed interval (`--refresh-metrics-max-interval 0`).
    refresh_metrics_interval: float = 0.05
    refresh_metrics_max_interval: float = DEFAULT_MAX_SCRAPE_INTERVAL
    metrics_staleness_threshold: float = 2.0
    scrape_timeout: float = 1.0
    pool_name: str = "default"
    # The pods' namespace (the `namespace` label of scheduling attempts): the pool's with
    # Kubernetes discovery, else $NAMESPACE, else "default" (GIE's --pool-namespace rule).
    namespace: str = "default"
    scrape: bool = True
    endpoints: list[Endpoint] = field(default_factory=list)
    # Re-read this endpoints file when it changes (e.g. a Kubernetes ConfigMap);
    # `extra_endpoints` (from --endpoint flags) stay beside it.
    watch_file: str | None = None
    extra_endpoints: list[Endpoint] = field(default_factory=list)
    # Kubernetes discovery (--pool-name / --endpoint-selector): it owns the pool.
    kubernetes: KubeSource | None = None
    # Measure responses (TTFT, ITL, usage; in-flight until the response ends). Needs
    # Envoy's response phases (deploy/envoy/envoy.yaml ships them on).
    response_path: bool = True
    # `--response-path observer`: the response comes on Envoy's second, observability-mode
    # ext_proc stream (deploy/envoy/envoy-observer.yaml), off the client's path.
    response_observer: bool = False
    # `--tracing`: OpenTelemetry spans per request stage (epp/tracing.py).
    tracing: bool = False
    # `--planner FILE`: the parsed planner file and its profile (sla/dynamo modes).
    planner: PlannerConfig | None = None
    planner_profile: Profile | None = None
    # Objective name → priority (--objectives); priority < 0 is shed (429) when saturated.
    objectives: Objectives = field(default_factory=Objectives)
    # Several EPPs with --planner: only the elected one's planner acts (None: always acts).
    election: election_cli.ElectionSpec | None = None
    # TLS on the ext_proc port (--secure-serving / --cert-path); None: plaintext.
    tls: ServerCert | None = None


class EppServer:
    """The whole EPP in one object: `await start()`, serve, `await stop()`."""

    def __init__(
        self,
        options: ServeOptions,
        config: LoadedConfig | None = None,
        seed: int | None = None,
        *,
        planner_ticks: Ticks | None = None,
    ) -> None:
        self.options = options
        rng = random.Random(seed)
        self.config = config or load_default_config(Handle(rng=rng), install_plugins())
        # Staleness is judged in time the loop was able to run (epp/datalayer/loopclock.py).
        self.clock = LoopClock()
        self.datastore = Datastore(
            staleness=options.metrics_staleness_threshold,
            clock=self.clock.now,
            require_metrics=options.scrape,
            # The requests' own times (a pending request's age, read by the latency
            # predictor against the plugins' `Handle.clock` and the response records)
            # are real time: the servers keep working while this loop stalls.
            inflight_clock=time.monotonic,
        )
        self.datastore.set_endpoints(options.endpoints)
        handle = self.config.handle
        handle.pool = self.datastore.endpoints
        handle.on_pool_change = self.datastore.on_change
        flow = self.config.flow_control
        detector = self.config.saturation_detector
        self.director = Director(
            self.datastore,
            self.config.scheduler,
            self.config.pre_request,
            rng,
            # With flow control, it sheds sheddable requests (before they could wait).
            Admission(None if flow else detector, options.objectives),
            namespace=options.namespace,
        )
        if flow is not None and detector is not None:
            self.director.flow_control = FlowController(
                flow, detector, self.datastore, options.objectives, options.pool_name
            )
        # The status page's recent decisions (`/` on the metrics port): one append per pick.
        self.decisions = DecisionRing()
        self.director.decision_sinks.append(self.decisions.record)
        self.commit = "unknown"
        # Subscribe with `self.observer.subscribe(sink)`; None with --response-path off.
        self.observer = (
            ResponseObserver(self.config.post_response) if options.response_path else None
        )
        self._lifecycle = [p for p in self.config.plugins.values() if isinstance(p, Lifecycle)]
        self.scraper: ScraperThread | None = None  # its own thread: off the request loop
        self._servers: list = []
        self._watch: asyncio.Task | None = None
        self.discovery: KubernetesDiscovery | None = None
        self._runner: web.AppRunner | None = None
        self.grpc_port = 0
        self.health_port = 0
        self.metrics_port = 0
        self.servicer = None
        self.tracer: RequestTracer | None = None
        self._planner_ticks = planner_ticks
        self.planner: PlannerThread | None = None
        self.elector: Elector | None = None
        self.health = None

    async def start(self) -> None:
        o = self.options
        self.clock.start()
        register_pool(o.pool_name, self.datastore.snapshot)
        flow = self.director.flow_control
        if flow is not None:
            register_flow_control(flow.metrics_snapshot)
            self.datastore.metrics_listeners.append(flow.capacity_freed)
            self.datastore.on_change(flow.capacity_freed)
        self.commit = await asyncio.to_thread(build_commit)
        set_build_info(self.commit)
        if o.scrape:
            self.scraper = ScraperThread(self.datastore, self._scrape_config())
            self.scraper.start()
        for plugin in self._lifecycle:
            await plugin.start()
        if o.kubernetes is not None:
            # In a thread: importing the client's API classes takes seconds of CPU.
            self.discovery = await asyncio.to_thread(
                KubernetesDiscovery, o.kubernetes, self.datastore
            )
            await self.discovery.start()
        if o.watch_file:
            self._watch = asyncio.create_task(
                watch_endpoints_file(o.watch_file, self.datastore, extra=o.extra_endpoints)
            )
        if self.scraper is not None:
            await self._first_scrape()
        main, health_srv, servicer, health, gport, hport = await start_grpc_servers(
            self.director,
            self.datastore,
            o.host,
            o.grpc_port,
            o.health_port,
            observer=self.observer,
            limits=o.limits,
            tls=o.tls,
            routes=RouteTable() if o.response_observer and self.observer else None,
            tracer=self._start_tracing() if o.tracing else None,
        )
        self._servers = [main, health_srv]
        self.servicer = servicer
        self.health = health
        self.grpc_port, self.health_port = gport, hport
        self.datastore.on_change(lambda: asyncio.ensure_future(health.refresh()))
        self._runner, self.metrics_port = await _start_metrics_http(self, o.host, o.metrics_port)
        if o.planner is not None:
            await self._start_planner(o.planner)

    async def _start_planner(self, cfg: PlannerConfig) -> None:
        """The planner thread, fed by the director (admissions) and the response
        observer (finished requests), acting through its connector on this loop (only
        while its elector leads, with several EPPs)."""
        # In a thread: a Lease elector imports the Kubernetes client (seconds of CPU).
        self.elector = await asyncio.to_thread(election_cli.build_elector, self.options.election)
        await self.elector.start()
        log.info("%s", self.elector.describe())
        planner = build_live_planner(
            cfg,
            self.options.planner_profile,
            self.datastore,
            asyncio.get_running_loop(),
            pool=self.options.pool_name,
            ticks=self._planner_ticks,
            elector=self.elector,
        )
        self.director.admission_sinks.append(planner.on_admit)
        if self.observer is not None:
            self.observer.subscribe(planner.on_record)
        else:
            log.warning("planner: --response-path off, so no TTFT/ITL and no safe drain")
        if cfg.budget.min_endpoint == 0:  # the pool may reach zero: hold, don't refuse
            self.director.cold_start = ColdStart(
                planner.wake_from_zero, cfg.live.cold_start_timeout, cfg.live.cold_start_queue
            )
        self.planner = planner
        await start_live_planner(planner, cfg.budget.min_endpoint)

    async def _first_scrape(self) -> None:
        """Take no request before each endpoint's first scrape (bounded): see
        `epp.datalayer.first_scrape`."""
        cfg = self._scrape_config()
        pending = await await_first_scrape(self.datastore, cfg.timeout + cfg.interval)
        if pending:
            log.warning(
                "serving before the first scrape of %d endpoint(s) finished: %s",
                len(pending),
                ", ".join(pending[:5]),
            )

    def _scrape_config(self) -> ScrapeConfig:
        """Scrape settings from the flags plus the config's data-layer plugins, if any."""
        from plugins.datalayer.sources import CoreMetricsExtractor, MetricsDataSource

        o = self.options
        extra: dict[str, object] = {}
        for source in self.config.plugins_of(MetricsDataSource):
            p = source.params
            extra.update(scheme=p.scheme, path=p.path, insecure_skip_verify=p.insecure_skip_verify)
        for extractor in self.config.plugins_of(CoreMetricsExtractor):
            p = extractor.params
            keys = (p.engine_label_key, *ScrapeConfig().engine_label_keys)
            extra.update(default_engine=p.default_engine, engine_label_keys=keys)
        return ScrapeConfig(
            interval=o.refresh_metrics_interval,
            max_interval=o.refresh_metrics_max_interval,
            timeout=o.scrape_timeout,
            **extra,  # type: ignore[arg-type]
        )

    async def drain(self) -> bool:
        """Health NOT_SERVING (Envoy stops sending), then refuse new streams and wait up
        to `drain_timeout` for open ones; True if they all ended in time."""
        if self.health is None or self.servicer is None:
            return True
        await self.health.drain()
        done = await self.servicer.drain(self.options.drain_timeout)
        if not done:
            log.warning(
                "drain: %d streams still open after %gs; closing them",
                self.servicer.open_streams,
                self.options.drain_timeout,
            )
        return done

    def _start_tracing(self) -> RequestTracer:
        from epp.tracing import build_tracer, instrument

        self.tracer = build_tracer()
        instrument(self.director.scheduler)
        log.info("tracing on: OpenTelemetry spans per request (epp/tracing.py)")
        return self.tracer

    async def stop(self) -> None:
        if self.tracer is not None:
            await asyncio.to_thread(self.tracer.shutdown)  # flushes what is batched
            self.tracer = None
        if self.planner is not None:
            await stop_live_planner(self.planner)
            self.planner = None
        if self.elector is not None:
            await self.elector.stop()
            self.elector = None
        if self.discovery is not None:
            await self.discovery.stop()
            self.discovery = None
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)
            self._watch = None
        for server in self._servers:
            await server.stop(grace=1.0)
        self._servers = []
        for plugin in self._lifecycle:
            try:
                await plugin.stop()
            except Exception:
                log.exception("plugin %r failed to stop", plugin)
        if self.scraper is not None:
            await self.scraper.stop()
            self.scraper = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.clock.stop()

    async def __aenter__(self) -> EppServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def _start_metrics_http(server: EppServer, host: str, port: int) -> tuple[web.AppRunner, int]:
    async def metrics(_: web.Request) -> web.Response:
        update_loop_tasks()
        return web.Response(
            body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def endpoints(_: web.Request) -> web.Response:
        ds = server.datastore
        rows = [
            {
                "name": s.name,
                "address": s.hostport,
                "labels": dict(s.endpoint.labels),
                "healthy": s.healthy,
                "last_error": ds.last_error(s.name),
                "models": sorted(s.models) if s.models is not None else None,
                "waiting": s.metrics.waiting_queue_size,
                "running": s.metrics.running_requests,
                "kv_cache_usage": s.metrics.kv_cache_usage,
                "inflight_requests": s.inflight_requests,
                "inflight_tokens": s.inflight_tokens,
                "inflight_prefill_tokens": s.inflight_prefill_tokens,
            }
            for s in ds.snapshot()
        ]
        return web.json_response(rows, dumps=lambda o: json.dumps(o, indent=2))

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    add_status_routes(app, server)
    app.router.add_get("/debug/endpoints", endpoints)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, bound


# ---- CLI ------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config", help="EndpointPickerConfig YAML (default: built-in queue+KV profile)"
    )
    p.add_argument("--endpoints", metavar="FILE", help="YAML list of {name, address, port, labels}")
    p.add_argument(
        "--endpoint",
        action="append",
        default=[],
        metavar="NAME=HOST:PORT[;LABEL=VALUE...]",
        help="an endpoint of the pool (repeatable)",
    )
    p.add_argument(
        "--no-watch-endpoints",
        action="store_true",
        help="read --endpoints once; by default the file is re-read when it changes",
    )
    p.add_argument("--host", default="0.0.0.0", help="address to bind (default 0.0.0.0)")
    p.add_argument("--grpc-port", type=int, default=9002, help="ext_proc gRPC port (9002)")
    p.add_argument(
        "--secure-serving",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="serve the ext_proc port over TLS: the certificate in --cert-path, else a "
        "self-signed one made at start (upstream's default; here plaintext is, see "
        "docs/ARCHITECTURE.md 'TLS'). The health port stays plaintext",
    )
    p.add_argument(
        "--cert-path",
        metavar="DIR",
        default=None,
        help="directory with tls.crt and tls.key (a mounted kubernetes.io/tls Secret); "
        "implies --secure-serving",
    )
    p.add_argument(
        "--enable-cert-reload",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="re-read --cert-path's files when they change; new connections get the new "
        "certificate, open ones keep theirs (default on with --cert-path; upstream's "
        "flag, off there)",
    )
    p.add_argument("--health-port", type=int, default=9003, help="gRPC health port (9003)")
    p.add_argument("--metrics-port", type=int, default=9090, help="Prometheus /metrics port (9090)")
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        help=f"request bodies above this get 413 (default {DEFAULT_MAX_BODY_BYTES})",
    )
    p.add_argument(
        "--max-buffered-bytes",
        type=int,
        default=DEFAULT_MAX_BUFFERED_BYTES,
        help="request-body bytes held across all open streams; a chunk beyond gets 503 "
        f"(default {DEFAULT_MAX_BUFFERED_BYTES})",
    )
    p.add_argument(
        "--body-timeout",
        type=float,
        default=DEFAULT_BODY_TIMEOUT,
        metavar="SECONDS",
        help=f"a request whose body has not ended this long after the stream opened "
        f"gets 408 ({DEFAULT_BODY_TIMEOUT:g})",
    )
    add_body_share_flags(p)
    defaults, headers = BodyLimits(), HeaderLimits()
    p.add_argument(
        "--max-json-depth",
        type=int,
        default=defaults.max_json_depth,
        help=f"bodies nesting deeper get 400 ({defaults.max_json_depth})",
    )
    p.add_argument(
        "--max-messages",
        type=int,
        default=defaults.max_messages,
        help=f"chat requests with more messages get 400 ({defaults.max_messages})",
    )
    p.add_argument(
        "--max-prompt-tokens",
        type=int,
        default=defaults.max_prompt_tokens,
        help=f"prompts estimated longer get 400 ({defaults.max_prompt_tokens})",
    )
    p.add_argument(
        "--max-request-headers",
        type=int,
        default=headers.max_count,
        help="the gateway's max_request_headers_count: requests whose headers plus the EPP's "
        f"would exceed it get 431 ({headers.max_count})",
    )
    p.add_argument(
        "--max-request-headers-kb",
        type=int,
        default=headers.max_kb,
        help=f"the gateway's max_request_headers_kb, likewise ({headers.max_kb})",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM, how long open requests may take to finish (30)",
    )
    p.add_argument(
        "--refresh-metrics-interval",
        type=float,
        default=0.05,
        metavar="SECONDS",
        help="how often each endpoint's /metrics is scraped while its metrics change "
        "(0.05, upstream's; see --refresh-metrics-max-interval for idle endpoints)",
    )
    p.add_argument(
        "--refresh-metrics-max-interval",
        type=float,
        default=None,
        metavar="SECONDS",
        help="adaptive scraping: an endpoint whose metrics did not change is scraped half as "
        "often each time, up to this, and at --refresh-metrics-interval again after any "
        "change; must be below --metrics-staleness-threshold (default 1, or half the "
        "staleness threshold if that is lower; 0 = a fixed interval, upstream's)",
    )
    p.add_argument(
        "--metrics-staleness-threshold",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="an endpoint whose last good scrape is older is unhealthy (2.0)",
    )
    p.add_argument("--scrape-timeout", type=float, default=1.0, metavar="SECONDS", help="(1.0)")
    k8s_cli.add_arguments(p)
    p.add_argument(
        "--response-path",
        choices=["on", "off", "observer"],
        default="on",
        help="measure responses (TTFT, ITL, usage, metrics, PostResponse plugins) and hold "
        "in-flight counts until each response ends (on, the default; Envoy must send the "
        "response phases as deploy/envoy/envoy.yaml does). observer: the same, measured on "
        "Envoy's second ext_proc filter in observability mode, so response chunks do not "
        "wait for the EPP (deploy/envoy/envoy-observer.yaml; one EPP per Envoy). off: for "
        "an Envoy that skips them, which saves EPP CPU per response chunk but ends "
        "in-flight counts at routing",
    )
    p.add_argument(
        "--planner",
        metavar="FILE",
        help="run the planner in this EPP: a planner YAML file (docs/planner.md lists its "
        "keys; config/planner.yaml is an example). It starts and stops model servers",
    )
    p.add_argument(
        "--objectives",
        metavar="FILE",
        help="objectives file (`objectives: [{name, priority}]` or InferenceObjective "
        "documents): x-gateway-inference-objective → priority; priority < 0 is sheddable "
        "(429 while the saturation detector says the pool is saturated)",
    )
    election_cli.add_arguments(p)
    p.add_argument(
        "--tracing",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="OpenTelemetry spans for each request's stages, W3C traceparent to the model "
        "server, exported as the OTEL_* environment says (OTLP to localhost:4317 by "
        "default; sampled 10%% unless OTEL_TRACES_SAMPLER says otherwise: llm-d-router's "
        "defaults). Off by default (llm-d-router defaults it on, printing spans to stdout); "
        "needs pip install 'epp[tracing]'",
    )
    p.add_argument("--seed", type=int, default=None, help="seed the tie-breaking random source")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def options_from_args(args: argparse.Namespace) -> tuple[ServeOptions, LoadedConfig]:
    """Validate everything before any port is opened; raises ConfigError / EndpointsError."""
    endpoints: list[Endpoint] = []
    if args.endpoints:
        endpoints += load_endpoints_file(args.endpoints)
    flagged = parse_endpoint_args(args.endpoint)
    endpoints += flagged
    names = [e.name for e in endpoints]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise EndpointsError(f"duplicate endpoint names across --endpoints/--endpoint: {dupes}")
    handle = Handle(rng=random.Random(args.seed))
    registry = install_plugins()
    config = (
        load_config_file(args.config, handle, registry)
        if args.config
        else load_default_config(handle, registry)
    )
    limits = _limits_from_args(args)
    if args.tracing:
        from epp.tracing import check_environment

        try:
            check_environment()
        except RuntimeError as e:
            raise ConfigError("", str(e)) from None
    hi = args.refresh_metrics_max_interval
    if hi is None:  # the default: 1 s, kept under the staleness threshold
        hi = min(DEFAULT_MAX_SCRAPE_INTERVAL, args.metrics_staleness_threshold / 2)
        hi = hi if hi > args.refresh_metrics_interval else 0.0
    if hi and not args.refresh_metrics_interval <= hi < args.metrics_staleness_threshold:
        raise ConfigError(
            "",
            f"--refresh-metrics-max-interval must be 0 or between --refresh-metrics-interval "
            f"({args.refresh_metrics_interval:g}) and below --metrics-staleness-threshold "
            f"({args.metrics_staleness_threshold:g}), got {hi:g}",
        )
    kube = k8s_cli.source_from_args(args)
    if kube is not None:
        load_api_client(kube.kubeconfig).close()  # bad credentials: exit 2 before serving
    planner, profile = load_planner(args.planner) if args.planner else (None, None)
    owns_pool = planner is not None and planner.live.environment == "local"
    if owns_pool and (kube is not None or (args.endpoints and not args.no_watch_endpoints)):
        raise ConfigError(
            "",
            "--planner adds and removes its own replicas; it cannot share the pool with "
            "Kubernetes discovery or a watched --endpoints file (use --endpoint flags, or "
            "--no-watch-endpoints)",
        )
    pool_name = args.pool_name or "default"
    election = election_cli.spec_from_args(
        args,
        has_planner=planner is not None,
        environment=planner.live.environment if planner else None,
        statefile=planner_statefile(planner, pool_name) if planner else None,
        kube_namespace=planner.live.kubernetes_namespace if planner else None,
        pool=pool_name,
    )
    tls = tls_from_args(args)
    opts = ServeOptions(
        host=args.host,
        grpc_port=args.grpc_port,
        health_port=args.health_port,
        metrics_port=args.metrics_port,
        limits=limits,
        tracing=args.tracing,
        drain_timeout=args.drain_timeout,
        refresh_metrics_interval=args.refresh_metrics_interval,
        refresh_metrics_max_interval=hi,
        metrics_staleness_threshold=args.metrics_staleness_threshold,
        scrape_timeout=args.scrape_timeout,
        pool_name=pool_name,
        namespace=kube.namespace if kube is not None else os.environ.get("NAMESPACE") or "default",
        endpoints=endpoints,
        watch_file=args.endpoints if args.endpoints and not args.no_watch_endpoints else None,
        extra_endpoints=flagged,
        kubernetes=kube,
        response_path=args.response_path != "off",
        response_observer=args.response_path == "observer",
        planner=planner,
        planner_profile=profile,
        objectives=load_objectives_file(args.objectives) if args.objectives else Objectives(),
        election=election,
        tls=tls,
    )
    return opts, config


def tls_from_args(args: argparse.Namespace) -> ServerCert | None:
    """--secure-serving / --cert-path → the certificate to serve, None for plaintext."""
    if args.cert_path is not None:
        if args.secure_serving is False:
            raise TlsError("--cert-path and --no-secure-serving contradict; drop one")
        cert = load_cert_dir(args.cert_path)
        if args.enable_cert_reload is False:
            return cert
        return dataclasses.replace(cert, reload_dir=args.cert_path)
    if args.enable_cert_reload:
        raise TlsError(
            "--enable-cert-reload re-reads --cert-path; give --cert-path DIR (a self-signed "
            "certificate is made once at start)"
        )
    return self_signed() if args.secure_serving else None


def planner_statefile(planner: PlannerConfig, pool: str) -> Path:
    """Where the local connector keeps its statefile (connectors/local.py)."""
    return Path(os.path.expanduser(planner.live.statefile.format(pool=pool)))


def load_planner(path: str) -> tuple[PlannerConfig, Profile | None]:
    """The planner file and, for the SLA modes, its profile; any fault is a ConfigError
    naming the file and the key, so `epp serve` stops before opening a port."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ConfigError("", f"cannot read the planner file: {e.strerror}", path) from None
    cfg = load_planner_file(text, path)
    try:
        check_live(cfg)
    except ConfigError as e:
        raise e.in_file(path) from None
    if cfg.planner.mode == "load":
        return cfg, None
    # Imported here: the profile reader pulls in scipy.interpolate (~2 s of CPU), which
    # only the SLA modes need; every other start (and restart) of `epp serve` skips it.
    from epp.planner.perf import ProfileError, load_profile

    try:
        return cfg, load_profile(cfg.planner.profile_results_dir)
    except (ProfileError, OSError) as e:
        raise ConfigError(
            "profile-results-dir",
            f"mode {cfg.planner.mode} needs profile data: {e} (run epp profile, or use mode: load)",
            path,
        ) from None


def _limits_from_args(args: argparse.Namespace) -> StreamLimits:
    """The limit flags, each checked; raises ConfigError naming the flag."""
    positive = (
        "refresh_metrics_interval",
        "metrics_staleness_threshold",
        "scrape_timeout",
        "max_body_bytes",
        "max_buffered_bytes",
        "body_timeout",
        "max_json_depth",
        "max_messages",
        "max_prompt_tokens",
        "max_request_headers_kb",
        "drain_timeout",
    )
    for name in positive:
        if getattr(args, name) <= 0:
            raise ConfigError("", f"--{name.replace('_', '-')} must be > 0")
    shares = body_shares_from_args(args)  # its own ConfigError, naming its flag
    try:
        return StreamLimits(
            max_body_bytes=args.max_body_bytes,
            max_buffered_bytes=args.max_buffered_bytes,
            body_timeout=args.body_timeout,
            body=BodyLimits(args.max_json_depth, args.max_messages, args.max_prompt_tokens),
            headers=HeaderLimits(args.max_request_headers, args.max_request_headers_kb),
            shares=shares,
        )
    except ValueError as e:
        raise ConfigError("", f"--max-request-headers: {e}") from None


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        opts, config = options_from_args(args)
    except (
        ConfigError,
        EndpointsError,
        PluginImportError,
        PoolSpecError,
        KubeConfigError,
        election_cli.ElectionError,
        TlsError,
    ) as e:
        print(f"epp serve: {e}", file=sys.stderr)
        return 2
    if not (opts.endpoints or opts.watch_file or opts.kubernetes or opts.planner):
        log.warning(
            "no endpoints given (--endpoints/--endpoint/--pool-name/--endpoint-selector):"
            " every request will get 503"
        )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(opts, config, args.seed))
    return 0


async def _serve(opts: ServeOptions, config: LoadedConfig, seed: int | None) -> None:
    # Signal handlers first: a supervisor may send SIGTERM the moment it reads the line
    # below, and one that arrives before them kills the process undrained (exit -15).
    signals = asyncio.Queue[int]()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, signals.put_nowait, sig)
    server = EppServer(opts, config, seed)
    await server.start()
    # Start-up's objects (modules, protobuf descriptors, the config and its plugins: most
    # of the heap, all kept for the process's life) leave the collector's generations: a
    # full collection then walks what requests left behind, not the whole heap (28.6 ms
    # per full collection under bench/extproc_cpu.py load, every ~10 s; issue 13 §6).
    gc.freeze()
    log.info("%s", config.describe())
    pool = opts.kubernetes.describe() if opts.kubernetes else f"{len(opts.endpoints)} endpoints"
    if server.planner is not None:
        have = server.planner.connector.replicas().values()
        ready, starting = sum(r.ready for r in have), sum(r.starting for r in have)
        pool += f" and the planner ({ready} replicas ready, {starting} starting)"
    tls = f" over TLS ({opts.tls.source} certificate)" if opts.tls else ""
    if opts.tls is not None and opts.tls.reload_dir is not None:
        tls = tls[:-1] + ", reloaded on change)"
    print(
        f"epp serving ext_proc on {opts.host}:{server.grpc_port}{tls} "
        f"(health {server.health_port}, metrics {server.metrics_port}) with {pool}",
        flush=True,
    )
    await signals.get()
    log.info(
        "draining: health NOT_SERVING, new streams refused, %d open get up to %gs "
        "(a second signal stops at once)",
        server.servicer.open_streams if server.servicer else 0,
        opts.drain_timeout,
    )
    drain = asyncio.ensure_future(server.drain())
    second = asyncio.ensure_future(signals.get())
    await asyncio.wait([drain, second], return_when=asyncio.FIRST_COMPLETED)
    drain.cancel()
    second.cancel()
    log.info("shutting down")
    await server.stop()
