"""A whole local deployment on loopback: simulators, `epp serve` and a real Envoy.

Shared by `epp demo`, the end-to-end tests and the benchmarks so all three exercise the
same thing a user would run. Every process lives in one `ProcessGroup`, so nothing
outlives the stack, whatever way it ends.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from epp.datastore import ROLE_LABEL
from epp.harness.envoy import (
    EnvoyOptions,
    RunningEnvoy,
    render_direct,
    response_path_options,
    start_envoy,
)
from epp.harness.procs import HttpReady, LogReady, ManagedProcess, ProcessGroup, free_port

EPP_CMD = [sys.executable, "-m", "epp.cli"]
PD_CONFIG = Path(__file__).resolve().parents[2] / "config" / "pd-disagg.yaml"


def start_epp_behind_envoy(
    pg: ProcessGroup,
    epp_args: Sequence[str],
    request_body_mode: str = "FULL_DUPLEX_STREAMED",
    response_path: bool | str = "log",
    *,
    n_epps: int = 1,
    tls: bool = False,
    per_epp_args: Sequence[Sequence[str]] = (),
    observer: bool = False,
    **envoy_options: Any,
) -> tuple[RunningEnvoy, int]:
    """`epp serve` (with `epp_args`: endpoints, config) and a real Envoy in front of it,
    on free loopback ports; returns Envoy and the EPP's metrics port. `response_path` is
    an `epp serve --response-path` mode, both sides set for it: "log" (the default:
    Envoy's Lua filter and access log, deploy/envoy/envoy.yaml), "on" (or True: every
    response chunk through the EPP), "off" (or False); `observer` True is "observer"
    (Envoy's observability-mode filter, deploy/envoy/envoy-observer.yaml);
    `envoy_options` are further `EnvoyOptions` fields (e.g. `failure_mode_allow`).

    `n_epps` > 1 starts that many EPP replicas (processes `epp`, `epp-1`, ...; each
    gets `per_epp_args[i]` too) in Envoy's one ext_proc cluster (active-active, as
    deploy/envoy/envoy-replicas.yaml); the metrics port returned is the first one's
    (`start_epps_behind_envoy` returns them all). `tls` runs them with
    `--secure-serving` behind Envoy's TLS variant (deploy/envoy/envoy-tls.yaml).

    The one way the demo, the e2e tests and the benchmarks put the EPP in front of any
    set of model servers (simulators or real vLLM).
    """
    envoy, metrics = start_epps_behind_envoy(
        pg,
        epp_args,
        request_body_mode,
        response_path,
        n_epps=n_epps,
        tls=tls,
        per_epp_args=per_epp_args,
        observer=observer,
        **envoy_options,
    )
    return envoy, metrics[0]


def start_epps_behind_envoy(
    pg: ProcessGroup,
    epp_args: Sequence[str],
    request_body_mode: str = "FULL_DUPLEX_STREAMED",
    response_path: bool | str = "log",
    *,
    n_epps: int = 1,
    tls: bool = False,
    per_epp_args: Sequence[Sequence[str]] = (),
    observer: bool = False,
    **envoy_options: Any,
) -> tuple[RunningEnvoy, list[int]]:
    """`start_epp_behind_envoy` returning every EPP's metrics port."""
    if n_epps < 1:
        raise ValueError(f"n_epps must be >= 1, got {n_epps}")
    if observer and not response_path:
        raise ValueError("observer=True is a response path: response_path must be True")
    mode = "observer" if observer else response_mode(response_path)
    ports: list[tuple[int, int]] = []
    metrics: list[int] = []
    for i in range(n_epps):
        grpc_port, health_port, metrics_port = free_port(), free_port(), free_port()
        argv = [*EPP_CMD, "serve", "--host", "127.0.0.1", "--grpc-port", str(grpc_port)]
        argv += ["--health-port", str(health_port), "--metrics-port", str(metrics_port)]
        argv += [*epp_args, *(per_epp_args[i] if i < len(per_epp_args) else ())]
        argv += ["--response-path", mode]
        argv += ["--secure-serving"] if tls else []
        name = "epp" if i == 0 else f"epp-{i}"
        pg.start(name, argv, ready=LogReady(r"epp serving ext_proc"), timeout=60)
        ports.append((grpc_port, health_port))
        metrics.append(metrics_port)
    envoy = start_envoy(
        pg,
        EnvoyOptions(
            listener_port=free_port(),
            admin_port=free_port(),
            epp_grpc_port=ports[0][0],
            epp_health_port=ports[0][1],
            listen_address="127.0.0.1",
            request_body_mode=request_body_mode,
            epp_tls=tls,
            extra_epps=tuple(ports[1:]),
            **(response_path_options(mode) | envoy_options),
        ),
        timeout=60,
    )
    return envoy, metrics


def response_mode(response_path: bool | str) -> str:
    """An `epp serve --response-path` mode from the harness's argument: True is the
    in-path "on" (what True always meant), False "off", a string itself."""
    if isinstance(response_path, str):
        return response_path
    return "on" if response_path else "off"


@dataclass
class SimProcess:
    name: str
    port: int
    args: list[str]
    process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def hostport(self) -> str:
        return f"127.0.0.1:{self.port}"


@dataclass(frozen=True)
class PDLayout:
    """P/D mode of a LocalStack: `prefill-i` simulators (role prefill, listed directly) and
    `decode-i` simulators (role decode), each behind an `epp sidecar` that the pool lists
    and that may name only this stack's prefill and encode simulators. `encode-i`
    simulators (`--ec-role encode`, role encode) make it an encode/prefill/decode pool."""

    n_prefill: int = 2
    n_decode: int = 2
    prefill_args: Sequence[str] = ()
    decode_args: Sequence[str] = ()
    n_encode: int = 0
    encode_args: Sequence[str] = ()
    sidecar_args: Sequence[str] = ()
    config: Path | None = PD_CONFIG


@dataclass
class LocalStack:
    """`n_sims` simulators (one process each, so one can be killed), the EPP, Envoy.

    With `pd` set, the simulators are the P/D layout instead (and `n_sims` is unused);
    `sidecars[i]` then fronts `decode-i`.
    """

    n_sims: int = 3
    sim_args: Sequence[str] = ()
    per_sim_args: dict[int, Sequence[str]] = field(default_factory=dict)
    epp_args: Sequence[str] = ()
    request_body_mode: str = "FULL_DUPLEX_STREAMED"
    # an `epp serve --response-path` mode ("log", the default; True is "on", False "off")
    response_path: bool | str = "log"
    # the response on Envoy's observability-mode filter (`--response-path observer`)
    observer: bool = False
    run_dir: Path | None = None
    sims: list[SimProcess] = field(default_factory=list)
    pg: ProcessGroup | None = None
    envoy: RunningEnvoy | None = None
    epp_metrics_port: int = 0
    pd: PDLayout | None = None
    sidecars: list[SimProcess] = field(default_factory=list)
    # further EnvoyOptions fields for the EPP's Envoy (e.g. failure_mode_allow=True)
    envoy_options: dict[str, Any] = field(default_factory=dict)
    # Several EPP replicas behind the one Envoy (active-active), and TLS on ext_proc.
    n_epps: int = 1
    epp_tls: bool = False
    epp_metrics_ports: list[int] = field(default_factory=list)

    def start(self) -> LocalStack:
        self.pg = ProcessGroup(self.run_dir)
        try:
            if self.pd is not None:
                endpoint_args = self._start_pd(self.pd)
            else:
                for i in range(self.n_sims):
                    args = [*self.sim_args, *self.per_sim_args.get(i, ())]
                    sim = SimProcess(f"sim-{i}", free_port(), list(args))
                    self._start_sim(sim)
                    self.sims.append(sim)
                endpoint_args = [f"--endpoint={s.name}={s.hostport}" for s in self.sims]
            self.envoy, self.epp_metrics_ports = start_epps_behind_envoy(
                self.pg,
                [*endpoint_args, *self.epp_args],
                self.request_body_mode,
                self.response_path,
                n_epps=self.n_epps,
                tls=self.epp_tls,
                observer=self.observer,
                **self.envoy_options,
            )
            self.epp_metrics_port = self.epp_metrics_ports[0]
        except BaseException:
            self.stop()
            raise
        return self

    def start_baseline_envoy(self, lb_policy: str = "ROUND_ROBIN") -> RunningEnvoy:
        """A second Envoy over the same simulators without the EPP (Envoy balances alone)."""
        assert self.pg is not None
        options = EnvoyOptions(
            listener_port=free_port(), admin_port=free_port(), listen_address="127.0.0.1"
        )
        upstreams = [("127.0.0.1", s.port) for s in self.sims]
        config = render_direct(options, upstreams, lb_policy)
        return start_envoy(
            self.pg, options, config=config, name=f"envoy-{lb_policy.lower()}", timeout=60
        )

    def _start_pd(self, pd: PDLayout) -> list[str]:
        """Start the P/D servers; returns the EPP's --endpoint flags (and --config)."""
        assert self.pg is not None
        endpoints = []
        for role, n, extra in (
            ("encode", pd.n_encode, ["--ec-role", "encode", *pd.encode_args]),
            ("prefill", pd.n_prefill, ["--kv-role", "prefill", *pd.prefill_args]),
            ("decode", pd.n_decode, ["--kv-role", "decode", *pd.decode_args]),
        ):
            for i in range(n):
                args = [*self.sim_args, *extra]
                sim = SimProcess(f"{role}-{i}", free_port(), args)
                self._start_sim(sim)
                self.sims.append(sim)
        remote = ("prefill-", "encode-")
        allow = [f"--allow={s.hostport}" for s in self.sims if s.name.startswith(remote)]
        for sim in self.sims:
            if sim.name.startswith(remote):
                role = sim.name.split("-", 1)[0]
                endpoints.append(f"--endpoint={sim.name}={sim.hostport};{ROLE_LABEL}={role}")
                continue
            sidecar = SimProcess(f"sidecar-{sim.name}", free_port(), [])
            argv = [*EPP_CMD, "sidecar", "--host", "127.0.0.1", "--port", str(sidecar.port)]
            argv += ["--decode-port", str(sim.port), *allow, *pd.sidecar_args]
            sidecar.process = self.pg.start(
                sidecar.name, argv, ready=LogReady(r"epp sidecar listening"), timeout=60
            )
            self.sidecars.append(sidecar)
            endpoints.append(f"--endpoint={sim.name}={sidecar.hostport};{ROLE_LABEL}=decode")
        return [*endpoints, *(["--config", str(pd.config)] if pd.config else [])]

    def _start_sim(self, sim: SimProcess, child_name: str | None = None) -> None:
        assert self.pg is not None
        argv = [*EPP_CMD, "sim", "--port", str(sim.port), "--name-prefix", sim.name, *sim.args]
        sim.process = self.pg.start(
            child_name or sim.name, argv, ready=HttpReady(f"{sim.url}/health"), timeout=60
        )

    @property
    def url(self) -> str:
        assert self.envoy is not None
        return self.envoy.url

    @property
    def epp_metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.epp_metrics_port}"

    def sim_by_port(self, port: int) -> SimProcess | None:
        return next((s for s in self.sims if s.port == port), None)

    def kill_sim(self, i: int) -> None:
        """Kill a simulator abruptly (SIGKILL), as a crashed server would die."""
        proc = self.sims[i].process
        assert proc is not None and proc.popen is not None
        proc.popen.kill()
        proc.popen.wait(timeout=10)

    def restart_sim(self, i: int) -> None:
        """Start a killed simulator again on the same port (a new child of the group)."""
        assert self.pg is not None
        n = sum(p.name.startswith(self.sims[i].name) for p in self.pg.processes)
        self._start_sim(self.sims[i], f"{self.sims[i].name}-restart{n}")

    @property
    def epp(self) -> ManagedProcess:
        """The EPP process started last (after `restart_epp`, the new one)."""
        assert self.pg is not None
        return [p for p in self.pg.processes if p.name.startswith("epp")][-1]

    def kill_epp(self) -> None:
        """Kill the EPP abruptly (SIGKILL), as a crash would: no drain."""
        self.epp.popen.kill()
        self.epp.popen.wait(timeout=10)

    def restart_epp(self) -> None:
        """Start the EPP again with the same arguments and ports; returns once it serves."""
        assert self.pg is not None
        old = self.epp
        if old.alive():
            raise RuntimeError("restart_epp: the EPP is still running; kill or stop it first")
        n = sum(p.name.startswith("epp") for p in self.pg.processes)
        self.pg.start(
            f"epp-restart{n}", old.argv, ready=LogReady(r"epp serving ext_proc"), timeout=60
        )

    def stop(self) -> None:
        if self.pg is not None:
            self.pg.close()
            self.pg = None

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
