"""`epp serve`'s flags: the argument table, and the check that turns parsed flags into
`ServeOptions` and a loaded config before any port is opened.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random

from epp.admission import Objectives, load_objectives_file
from epp.body_budget import add_body_share_flags, body_shares_from_args
from epp.composition import install_plugins
from epp.config.errors import ConfigError
from epp.config.loader import LoadedConfig, load_config_file, load_default_config
from epp.datalayer import k8s_cli
from epp.datalayer.endpoints_file import EndpointsError, load_endpoints_file, parse_endpoint_args
from epp.datalayer.k8s_discovery import load_api_client
from epp.datastore import Endpoint
from epp.election import cli as election_cli
from epp.extproc.access_log import RESPONSE_LOG_TIMEOUT
from epp.extproc.server import (
    DEFAULT_BODY_TIMEOUT,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_BUFFERED_BYTES,
    StreamLimits,
)
from epp.extproc.tls import ServerCert, TlsError, load_cert_dir, self_signed
from epp.limits import BodyLimits, HeaderLimits
from epp.planner.live.loading import load_planner, planner_statefile
from epp.rewrite import load_rewrites_file
from epp.scheduling.registry import Handle
from epp.serve_options import DEFAULT_MAX_SCRAPE_INTERVAL, ServeOptions
from epp.session_key import parse_sources


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
        "--session-key-sources",
        default=",".join(defaults.session_sources),
        help="where a request's session key comes from, first present wins: comma-separated "
        "header:NAME and body:FIELD[.FIELD] (the agent clients' headers as llm-d-router's "
        "agent-identity plugin lists them, prompt_cache_key, metadata.user_id, user, "
        "x-session-token); feeds session-affinity-scorer and is flow control's fairness id "
        "when the request names none; '' = none",
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
        choices=["log", "on", "off", "observer"],
        default="log",
        help="how responses are measured (TTFT, TPOT, usage, metrics, PostResponse plugins) "
        "and in-flight counts held until each ends. log (the default): Envoy's Lua filter "
        "reads the response and its gRPC access log sends the EPP one entry per finished "
        "request, so the EPP's cost does not grow with the answer's length "
        "(deploy/envoy/envoy.yaml). on: every response chunk passes through the EPP "
        "(one gRPC round trip per chunk; the prompt's prefill counts end at the first "
        "token). observer: the same measurement on Envoy's observability-mode ext_proc "
        "filter, off the client's path (deploy/envoy/envoy-observer.yaml; one EPP per "
        "Envoy). off: nothing measured, in-flight counts end at routing. Envoy's config "
        "must match the mode",
    )
    p.add_argument(
        "--response-log-timeout",
        type=float,
        default=RESPONSE_LOG_TIMEOUT,
        metavar="SECONDS",
        help="--response-path log: give a routed request's in-flight counts back when no "
        "access-log entry for it came for this long (Envoy logs a running request every "
        "5 s, deploy/envoy/envoy.yaml; none for this long: Envoy restarted or the log "
        'stream broke); counted in epp_response_log_entries_total{outcome="expired"} '
        f"({RESPONSE_LOG_TIMEOUT:g})",
    )
    p.add_argument(
        "--planner",
        metavar="FILE",
        help="run the planner in this EPP: a planner YAML file (docs/planner.md lists its "
        "keys; config/planner.yaml is an example). It starts and stops model servers",
    )
    p.add_argument(
        "--model-rewrites",
        metavar="FILE",
        help="InferenceModelRewrite documents (llm-d.ai/v1alpha2): a request's model name → "
        "weighted target models (canary, A/B), the same target for the same x-request-id; "
        "with --pool-name the cluster's are read too",
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
        response_log=args.response_path == "log",
        response_log_timeout=args.response_log_timeout,
        planner=planner,
        planner_profile=profile,
        objectives=load_objectives_file(args.objectives) if args.objectives else Objectives(),
        rewrites=load_rewrites_file(args.model_rewrites) if args.model_rewrites else [],
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
        "response_log_timeout",
    )
    for name in positive:
        if getattr(args, name) <= 0:
            raise ConfigError("", f"--{name.replace('_', '-')} must be > 0")
    shares = body_shares_from_args(args)  # its own ConfigError, naming its flag
    try:
        sources = parse_sources(args.session_key_sources)
    except ValueError as e:
        raise ConfigError("", f"--session-key-sources: {e}") from None
    try:
        return StreamLimits(
            max_body_bytes=args.max_body_bytes,
            max_buffered_bytes=args.max_buffered_bytes,
            body_timeout=args.body_timeout,
            body=BodyLimits(
                args.max_json_depth, args.max_messages, args.max_prompt_tokens, sources
            ),
            headers=HeaderLimits(args.max_request_headers, args.max_request_headers_kb),
            shares=shares,
        )
    except ValueError as e:
        raise ConfigError("", f"--max-request-headers: {e}") from None
