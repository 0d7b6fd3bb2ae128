"""`epp planner --prometheus URL --planner FILE`: the planner alone, outside `epp serve`.

Dynamo's planner is a process of its own that reads the frontend's metrics from
Prometheus (reference §1.1, §1.3); this is that shape for the EPP. The same policy, the
same thread (`loop.PlannerThread`), the same decision log and gauges as `epp serve
--planner`, but the observation comes from Prometheus (`source.PrometheusSource`: the
EPP's request histograms and per-role pool gauges) and the decisions go to a connector
that needs no EPP datastore: `virtual` (gRPC, proto/planner.proto) or `kubernetes`
(scale subresources). `local` is refused: it adds the replicas it starts to the EPP's
own datastore and drains them on its in-flight counts, which only `epp serve --planner`
has.

Prints `epp planner: deciding ...` (flushed) once it runs; SIGINT/SIGTERM stop it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys

from epp.config.errors import ConfigError
from epp.datastore import Datastore
from epp.observability import REGISTRY
from epp.planner.core.config import PlannerConfig
from epp.planner.live.loop import build_live_planner, start_live_planner, stop_live_planner
from epp.planner.live.source import PrometheusSource

log = logging.getLogger("epp.planner")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--prometheus", required=True, metavar="URL",
        help="the Prometheus server that scrapes the EPP(s), e.g. http://127.0.0.1:9090",
    )  # fmt: skip
    p.add_argument(
        "--planner", required=True, metavar="FILE",
        help="the planner file (docs/planner.md); environment virtual or kubernetes",
    )  # fmt: skip
    p.add_argument(
        "--pool-name", default="default",
        help="the pool gauges' name label (the EPP's --pool-name; default: default)",
    )  # fmt: skip
    p.add_argument(
        "--match", default="", metavar="MATCHERS",
        help="label matchers added to every series, e.g. 'job=\"epp\"' (one Prometheus, "
        "several pools)",
    )  # fmt: skip
    p.add_argument(
        "--metrics-port", type=int, default=0,
        help="serve the planner's own epp_planner_* gauges on this port (0: none)",
    )  # fmt: skip
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def check(args: argparse.Namespace) -> tuple[PlannerConfig, object, PrometheusSource]:
    """Everything checked before anything starts; raises ConfigError."""
    from epp.planner.live.loading import load_planner

    if not args.prometheus.startswith(("http://", "https://")):
        raise ConfigError(
            "--prometheus", f"{args.prometheus!r} must start with http:// or https://"
        )
    if not 0 <= args.metrics_port <= 65535:
        raise ConfigError("--metrics-port", f"{args.metrics_port} is not a port (0-65535)")
    cfg, profile = load_planner(args.planner)
    if cfg.live.environment == "local":
        raise ConfigError(
            "environment",
            "local needs the EPP's datastore (the replicas it starts join it and drain on "
            "its in-flight counts): run it inside `epp serve --planner`, or use virtual or "
            "kubernetes here",
            args.planner,
        )
    return cfg, profile, PrometheusSource(args.prometheus, args.pool_name, args.match)


async def _run(cfg: PlannerConfig, profile: object, source: PrometheusSource, args) -> None:
    loop = asyncio.get_running_loop()
    planner = build_live_planner(
        cfg, profile, Datastore(), loop, pool=args.pool_name, source=source
    )
    if args.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port, registry=REGISTRY)
    await start_live_planner(planner, cfg.budget.min_endpoint)
    where = cfg.live.environment
    port = getattr(planner.connector, "port", 0)
    if port:
        where += f" on port {port}"
    print(
        f"epp planner: deciding every {cfg.interval_s:g} s from {source.url} "
        f"(mode {cfg.planner.mode}, pool {args.pool_name}), environment {where}",
        flush=True,
    )
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await stop_live_planner(planner)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        cfg, profile, source = check(args)
    except ConfigError as e:
        print(f"epp planner: {e}", file=sys.stderr)
        return 2
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_run(cfg, profile, source, args))
    except OSError as e:  # a port taken (virtual-address, --metrics-port)
        print(f"epp planner: {e}", file=sys.stderr)
        return 1
    return 0
