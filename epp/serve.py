"""`epp serve`: the endpoint picker process, composed.

Wires the pieces: endpoints (file and flags, or Kubernetes discovery) → datastore, the
metrics scraper filling it, the config's scheduler behind a director, the ext_proc and
health gRPC servers, the metrics/status HTTP port and the planner. `EppServer` is the same
thing in-process, for tests. The flags are in `epp.serve_args`, the options they make in
`epp.serve_options`, the HTTP port in `epp.metrics_http`, the planner file's loading in
`epp.planner.live.loading`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import random
import signal
import sys
import time
from typing import TYPE_CHECKING

from aiohttp import web

from epp.admission import Admission
from epp.buildinfo import build_commit
from epp.completion import ResponseObserver
from epp.composition import install_plugins
from epp.config.errors import ConfigError
from epp.config.loader import LoadedConfig, load_default_config
from epp.datalayer.endpoints_file import EndpointsError, watch_endpoints_file
from epp.datalayer.first_scrape import await_first_scrape
from epp.datalayer.k8s_discovery import KubeConfigError, KubernetesDiscovery
from epp.datalayer.k8s_pods import PoolSpecError
from epp.datalayer.k8s_resources import KubeObjectives, merged_objectives
from epp.datalayer.loopclock import LoopClock
from epp.datalayer.scrape_thread import ScraperThread
from epp.datalayer.scraper import ScrapeConfig
from epp.datastore import Datastore
from epp.director import ColdStart, Director
from epp.election import cli as election_cli
from epp.election.base import Elector
from epp.extproc.access_log import route_table
from epp.extproc.server import start_grpc_servers
from epp.extproc.tls import TlsError
from epp.flowcontrol.controller import FlowController
from epp.flowcontrol.eviction import new_evictor
from epp.flowcontrol.metrics import register_flow_control
from epp.metrics_http import start_metrics_http
from epp.observability import register_pool, set_build_info
from epp.planner.core.config import PlannerConfig
from epp.planner.live.loop import (
    PlannerThread,
    Ticks,
    build_live_planner,
    start_live_planner,
    stop_live_planner,
)
from epp.rewrite import ModelRewrites, Rewrite
from epp.scheduling.interfaces import Lifecycle
from epp.scheduling.registry import Handle, PluginImportError
from epp.serve_args import add_arguments, options_from_args
from epp.serve_options import ServeOptions
from epp.status.ring import DecisionRing
from epp.status.routes import add_status_routes

# `epp serve` is this module (epp/cli.py): its flags and its run; tests build the options.
__all__ = ["EppServer", "ServeOptions", "add_arguments", "options_from_args", "run"]

if TYPE_CHECKING:
    from epp.tracing import RequestTracer

log = logging.getLogger("epp")


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
            # Eviction stops a running request on its routing stream, which only the
            # in-path response mode keeps open past routing.
            in_path = (
                options.response_path and not options.response_observer and not options.response_log
            )
            if flow.enable_eviction and in_path:
                self.director.flow_control.eviction = new_evictor(
                    detector, options.pool_name, options.refresh_metrics_interval
                )
            elif flow.enable_eviction:
                log.warning(
                    "flowControl.enableEviction is ignored: it needs --response-path on "
                    "(with log, off or observer the routing stream ends at routing, so a "
                    "running request cannot be stopped)"
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
        self.cluster_objectives: KubeObjectives | None = None
        self.director.rewrites = ModelRewrites.build(options.rewrites) or None
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

    def _set_cluster_objectives(self, priorities: dict[str, int]) -> None:
        """The pool's InferenceObjectives changed (on the loop): over --objectives."""
        objectives = merged_objectives(self.options.objectives, priorities)
        if self.director.admission is not None:
            self.director.admission.objectives = objectives
        if self.director.flow_control is not None:
            self.director.flow_control.objectives = objectives
        n = len(objectives.priorities)
        log.info("objectives: %d (%d from the cluster)", n, len(priorities))

    def _set_cluster_rewrites(self, rewrites: list[Rewrite]) -> None:
        """The pool's InferenceModelRewrites changed (on the loop): with --model-rewrites."""
        table = ModelRewrites.build([*self.options.rewrites, *rewrites])
        self.director.rewrites = table or None
        log.info("model rewrites: %s", ", ".join(table.names) or "none")

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
            if o.kubernetes.pool_name:
                self.cluster_objectives = KubeObjectives(
                    self.discovery.api,
                    o.kubernetes.namespace,
                    o.kubernetes.pool_name,
                    self._set_cluster_objectives,
                    self._set_cluster_rewrites,
                )
                await self.cluster_objectives.start()
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
            routes=route_table(o.response_observer, o.response_log, o.response_log_timeout)
            if self.observer
            else None,
            tracer=self._start_tracing() if o.tracing else None,
        )
        self._servers = [main, health_srv]
        self.servicer = servicer
        self.health = health
        self.grpc_port, self.health_port = gport, hport
        self.datastore.on_change(lambda: asyncio.ensure_future(health.refresh()))
        self._runner, self.metrics_port = await start_metrics_http(
            self.datastore, o.host, o.metrics_port, self._mount_status
        )
        if o.planner is not None:
            await self._start_planner(o.planner)

    def _mount_status(self, app: web.Application) -> None:
        add_status_routes(
            app,
            pool_name=self.options.pool_name,
            datastore=self.datastore,
            decisions=self.decisions,
            planner=lambda: self.planner,
            commit=lambda: self.commit,
        )

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
        if self.cluster_objectives is not None:
            await self.cluster_objectives.stop()  # before the client it reads with closes
            self.cluster_objectives = None
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
    # per full collection under bench/extproc_cpu.py load, every ~10 s).
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
