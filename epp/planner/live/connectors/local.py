"""Local connector: model-server processes on this machine, one per replica, started
from a command template per role (`epp sim --port {port}`, or a real vLLM command).

- **Start**: spawn the command in its own session (its own process group, so stopping
  it stops its children too), poll `GET {worker-health-path}` until 200, only then add
  the endpoint to the datastore: the EPP never routes to a replica still loading.
- **Scale down**: cancel starting replicas first (they carry no work), then drain
  ready ones (`drain.Drain`: out of scheduling at once, wait for the EPP's in-flight
  count to reach 0, stop after `drain-timeout` regardless): 0 failed requests where
  Dynamo's SIGTERM drops them (#13559).
- **Stop** (SIGTERM to the group, SIGKILL after a grace period): `epp.procs`, the
  code the harness stops its children with.
- **P/D pools**: prefill and decode replicas from their own command templates, each
  role scaled on its own. Each decode replica gets its `epp sidecar`
  (`decode-sidecar-command`) in the decode server's process group, so one signal stops
  both and neither is orphaned; the pool lists the sidecar's port. The sidecar may dial
  only the prefill replicas this connector started: it reads them from a file the
  connector rewrites atomically whenever a prefill replica starts or stops
  (`--allow-from-endpoints`, re-checked by the sidecar at most every
  `ALLOWLIST_RECHECK_S`), and a new prefill replica enters the datastore only once that
  much time has passed since the file named it, so no sidecar refuses it (403).
- **Statefile** (`statefile.py`), written atomically after every change. A restarted
  EPP adopts every recorded replica that still runs its recorded command and answers
  its health check; the others are forgotten (and killed if their group still lives).

- **Follow** (several EPPs, one leader: epp/election/): a follower's planner never
  starts this connector; `follow()` mirrors the leader's statefile into the follower's
  datastore (the replicas whose recorded pid still runs its command), so every EPP
  routes over the same pool; the scraper's health gating keeps a replica that is still
  loading out, and a replica the leader drains (`draining` in the statefile, saved when
  the drain begins) is draining in every follower too, so none routes new requests to
  it. `unfollow()` on taking over drops what was mirrored and not adopted.

Replicas outlive an EPP that is killed (SIGKILL, crash), so a restart adopts them; a
clean exit (`epp serve` stopping on SIGINT/SIGTERM) stops every replica it owns, so
nothing is orphaned. Not armed with PR_SET_PDEATHSIG for that reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from epp.datastore import ROLE_LABEL, Datastore, Endpoint
from epp.planner.core.config import LiveParams
from epp.planner.core.drain import Drain, DrainStep
from epp.planner.core.types import Replicas, Role
from epp.planner.live.connectors.statefile import WorkerRecord, decode, encode
from epp.procs import astop_then_kill, free_port, signal_group
from epp.sidecar.allowlist import ALLOWLIST_RECHECK_S

log = logging.getLogger("epp.planner.local")

STOP_GRACE_S = 5.0
_POLL_S = 0.05
STARTING, READY, DRAINING = "starting", "ready", "draining"


@dataclass(eq=False)
class Worker:
    record: WorkerRecord
    state: str = STARTING
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)  # None: adopted
    sidecar: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    task: asyncio.Task | None = field(default=None, repr=False)
    listed_at: float = 0.0  # prefill: when the allowlist file first named it

    @property
    def name(self) -> str:
        return self.record.name


def resolve_argv(template: str, **values: object) -> list[str]:
    """The command for one replica; a leading `epp` runs this installation's epp (the
    venv's script beside the interpreter), so a test or a venv needs no PATH change."""
    argv = shlex.split(template.format(**values))
    if argv and argv[0] == "epp":
        script = Path(sys.executable).with_name("epp")
        argv[:1] = [str(script)] if script.exists() else [sys.executable, "-m", "epp.cli"]
    return argv


def _cmdline(pid: int) -> tuple[str, ...] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return tuple(a.decode(errors="replace") for a in raw.split(b"\0") if a)


def _runs(pid: int, argv: tuple[str, ...]) -> bool:
    """`pid` is alive and runs `argv` (a script's shebang puts its interpreter in front,
    so the recorded argv is the tail of the command line). A pid the kernel reused for
    another program, or a zombie (empty command line), does not."""
    cmd = _cmdline(pid)
    return bool(cmd) and len(cmd) >= len(argv) and cmd[len(cmd) - len(argv) :] == argv


class LocalConnector:
    def __init__(
        self,
        datastore: Datastore,
        params: LiveParams,
        roles: Sequence[Role],
        *,
        pool: str = "default",
        run_dir: str | Path | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.datastore = datastore
        self.params = params
        self.roles = tuple(roles)
        missing = [r.value for r in self.roles if not params.command_for(r)]
        if missing:
            raise ValueError(f"no worker command for {', '.join(missing)} (config.check_live)")
        self.statefile = Path(os.path.expanduser(params.statefile.format(pool=pool)))
        # the decode sidecars' allowlist: every prefill replica this connector started
        self.prefill_file = self.statefile.with_name(f"{pool}-prefill-endpoints.yaml")
        self._prefill_listed: tuple[tuple[str, int], ...] | None = None
        self._listed_at = 0.0
        self.run_dir = Path(run_dir) if run_dir else self.statefile.parent / f"{pool}-logs"
        self.clock = clock
        self._workers: dict[str, Worker] = {}
        self._next = 0
        self._session: aiohttp.ClientSession | None = None
        self._lock = asyncio.Lock()
        self._mirrored: set[str] = set()

    # ---- views (any thread) ------------------------------------------------
    def replicas(self) -> Mapping[Role, Replicas]:
        workers = list(self._workers.values())
        out = {}
        for role in self.roles:
            mine = [w for w in workers if w.record.role == role]
            out[role] = Replicas(
                ready=sum(w.state == READY for w in mine),
                starting=sum(w.state == STARTING for w in mine),
                draining=sum(w.state == DRAINING for w in mine),
            )
        return out

    def ready_names(self) -> frozenset[str]:
        return frozenset(w.name for w in list(self._workers.values()) if w.state == READY)

    def workers(self) -> list[WorkerRecord]:
        return [w.record for w in list(self._workers.values())]

    # ---- lifecycle ---------------------------------------------------------
    async def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=2.0), trust_env=False
        )
        await self._adopt()
        self._save()  # the statefile and, in a P/D pool, the sidecars' allowlist exist

    async def stop(self) -> None:
        """Stop every replica (clean exit: nothing is left behind) and clear the state."""
        workers = list(self._workers.values())
        for w in workers:
            if w.task is not None and w.task is not asyncio.current_task():
                w.task.cancel()
        await asyncio.gather(*(self._terminate(w) for w in workers))
        for w in workers:
            self.datastore.remove_endpoint(w.name)
        self._workers.clear()
        self._save()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def settle(self) -> None:
        """Wait until no replica is starting or draining (tests, the demo)."""
        while True:
            tasks = [w.task for w in list(self._workers.values()) if w.task and not w.task.done()]
            if not tasks:
                return
            await asyncio.gather(*tasks, return_exceptions=True)

    # ---- scaling -----------------------------------------------------------
    async def set_replicas(self, role: Role, n: int, prefer_drain: Sequence[str] = ()) -> None:
        async with self._lock:
            mine = [w for w in self._workers.values() if w.record.role == role]
            active = [w for w in mine if w.state in (STARTING, READY)]
            if n > len(active):
                for _ in range(n - len(active)):
                    self._spawn(role)
            elif n < len(active):
                excess = len(active) - n
                starting = [w for w in active if w.state == STARTING]
                for w in starting[:excess]:
                    log.info("planner: cancelling %s (still starting)", w.name)
                    if w.task is not None:
                        w.task.cancel()
                    await self._retire(w)
                excess -= min(excess, len(starting))
                ready = [w for w in active if w.state == READY]
                ready.sort(key=lambda w: (w.name not in prefer_drain, self._inflight(w), w.name))
                for w in ready[:excess]:
                    self._begin_drain(w)

    async def drain(self, name: str) -> None:
        w = self._workers.get(name)
        if w is not None and w.state == READY:
            self._begin_drain(w)
            assert w.task is not None
            await asyncio.gather(w.task, return_exceptions=True)

    def _inflight(self, w: Worker) -> int:
        return self.datastore.inflight(w.name)[0]

    def _sidecar_template(self, role: Role) -> str | None:
        return self.params.decode_sidecar_command if role == Role.DECODE else None

    def _spawn(self, role: Role) -> Worker:
        name = f"{role.value}-{self._next}"
        self._next += 1
        host = self.params.worker_host
        port = free_port(host)
        sidecar_template = self._sidecar_template(role)
        own = port
        if sidecar_template is not None:
            while own == port:  # the decode server's own port, behind its sidecar
                own = free_port(host)
        template = self.params.command_for(role) or ""
        argv = resolve_argv(template, port=own, host=host, name=name, role=role.value)
        log_path = self.run_dir / f"{name}.log"
        # its own process group; a sidecar joins it, which needs the EPP's session
        # (setpgid never crosses sessions), so only a lone server gets a session of its own
        popen = _popen(argv, log_path, start_new_session=sidecar_template is None,
                       pgid=None if sidecar_template is None else 0)  # fmt: skip
        rec = WorkerRecord(name, role, port, popen.pid, tuple(argv), str(log_path))
        w = Worker(rec, STARTING, popen)
        if sidecar_template is not None:
            side_argv = resolve_argv(
                sidecar_template, port=port, decode_port=own, host=host, name=name,
                role=role.value, prefill_endpoints=self.prefill_file,
            )  # fmt: skip
            try:  # in the decode server's group: one killpg stops both
                w.sidecar = _popen(side_argv, log_path.with_suffix(".sidecar.log"), pgid=popen.pid)
            except (OSError, subprocess.SubprocessError) as e:  # the server died already
                log.error("planner: cannot start the sidecar of %s: %s", name, e)
            else:
                rec = dataclasses.replace(
                    rec, server_port=own, sidecar_pid=w.sidecar.pid, sidecar_argv=tuple(side_argv)
                )
                w.record = rec
        self._workers[name] = w
        self._save()
        if role == Role.PREFILL:
            w.listed_at = self._listed_at
        log.info("planner: starting %s on port %d (pid %d)", name, port, popen.pid)
        w.task = asyncio.create_task(self._await_ready(w))
        return w

    async def _await_ready(self, w: Worker) -> None:
        deadline = self.clock() + self.params.worker_ready_timeout
        try:
            while True:
                dead = next((p for p in (w.popen, w.sidecar) if p and p.poll() is not None), None)
                if dead is not None or (self._sidecar_template(w.record.role) and not w.sidecar):
                    log.error(
                        "planner: %s exited with code %s before it was ready; see %s",
                        w.name, dead.returncode if dead else None, w.record.log,
                    )  # fmt: skip
                    break
                if await self._healthy(w.record):
                    # a new prefill replica waits until every sidecar re-read its allowlist
                    await asyncio.sleep(max(0.0, w.listed_at + ALLOWLIST_RECHECK_S - self.clock()))
                    w.state = READY
                    self.datastore.add_endpoint(self._endpoint(w.record))
                    log.info("planner: %s ready", w.name)
                    return
                if self.clock() > deadline:
                    log.error(
                        "planner: %s not healthy after %.0f s (worker-ready-timeout); see %s",
                        w.name, self.params.worker_ready_timeout, w.record.log,
                    )  # fmt: skip
                    break
                await asyncio.sleep(_POLL_S)
        except asyncio.CancelledError:
            return  # the caller retires it
        await self._retire(w)

    async def _healthy(self, rec: WorkerRecord) -> bool:
        assert self._session is not None, "LocalConnector.start() was not called"
        url = f"http://{self.params.worker_host}:{rec.port}{self.params.worker_health_path}"
        try:
            async with self._session.get(url) as r:
                return r.status == 200
        except (TimeoutError, aiohttp.ClientError, OSError):
            return False

    def _endpoint(self, rec: WorkerRecord) -> Endpoint:
        labels = {} if rec.role == Role.AGGREGATED else {ROLE_LABEL: rec.role.value}
        return Endpoint(rec.name, self.params.worker_host, rec.port, labels)

    def _begin_drain(self, w: Worker) -> None:
        w.state = DRAINING
        w.record = dataclasses.replace(w.record, draining=True)
        self._save()  # followers stop routing to it too (follow)
        self.datastore.set_draining(w.name)
        log.info("planner: draining %s (%d in flight)", w.name, self._inflight(w))
        w.task = asyncio.create_task(self._drain(w))

    async def _drain(self, w: Worker) -> None:
        d = Drain(w.name, self.clock(), self.params.drain_timeout)
        while (step := d.advance(self.clock(), self._inflight(w))) is DrainStep.KEEP:
            await asyncio.sleep(_POLL_S)
        if step is DrainStep.FORCE_STOP:
            log.warning(
                "planner: %s still had %d requests in flight after drain-timeout %.0f s; "
                "stopping it anyway", w.name, d.last_inflight, self.params.drain_timeout,
            )  # fmt: skip
        await self._retire(w)

    async def _retire(self, w: Worker) -> None:
        """Out of the pool, then stopped, then out of the statefile."""
        self.datastore.remove_endpoint(w.name)
        await self._terminate(w)
        self._workers.pop(w.name, None)
        self._save()
        log.info("planner: %s stopped", w.name)

    async def _terminate(self, w: Worker) -> None:
        pid = w.record.pid
        if w.popen is None and not self._running(w):
            return  # an adopted pid that exited (or now runs something else): leave it
        await astop_then_kill(
            lambda: signal_group(pid, signal.SIGTERM),
            lambda: signal_group(pid, signal.SIGKILL),
            lambda: self._running(w),
            STOP_GRACE_S,
            clock=self.clock,
        )
        for p in (w.popen, w.sidecar):
            if p is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    await asyncio.to_thread(p.wait, 5)

    def _running(self, w: Worker) -> bool:
        """Any process of the replica (server or sidecar) still runs."""
        if w.popen is not None:
            return any(p.poll() is None for p in (w.popen, w.sidecar) if p is not None)
        rec = w.record
        return _runs(rec.pid, rec.argv) or bool(
            rec.sidecar_pid and _runs(rec.sidecar_pid, rec.sidecar_argv)
        )

    # ---- a follower's view (on the loop) -------------------------------------
    def follow(self) -> None:
        """Mirror the leader's statefile: its live replicas become this datastore's."""
        try:
            records = decode(self.statefile.read_text(), str(self.statefile))
        except FileNotFoundError:
            records = []
        except Exception as e:  # the leader rewrites it atomically; a bad one is skipped
            log.debug("planner: follower cannot read %s: %s", self.statefile, e)
            return
        live = {r.name: r for r in records if r.role in self.roles and _runs(r.pid, r.argv)}
        for name in self._mirrored - set(live):
            self.datastore.remove_endpoint(name)
        known = {e.name: e for e in self.datastore.endpoints()}
        for rec in live.values():
            ep = self._endpoint(rec)
            if known.get(rec.name) != ep:
                self.datastore.add_endpoint(ep)
            self.datastore.set_draining(rec.name, rec.draining)
        self._mirrored = set(live)

    def unfollow(self) -> None:
        for name in self._mirrored - set(self._workers):
            self.datastore.remove_endpoint(name)
        self._mirrored = set()

    # ---- the statefile -----------------------------------------------------
    def _save(self) -> None:
        self.statefile.parent.mkdir(parents=True, exist_ok=True)
        _write_atomically(self.statefile, encode([w.record for w in self._workers.values()]))
        if Role.PREFILL in self.roles and Role.DECODE in self.roles:
            self._save_prefill_list()

    def _save_prefill_list(self) -> None:
        """The decode sidecars' allowlist: every prefill replica started and not yet
        stopped (an endpoints file, the shape `epp serve --endpoints` reads)."""
        host = self.params.worker_host
        listed = tuple(
            sorted((w.name, w.record.port) for w in self._workers.values()
                   if w.record.role == Role.PREFILL)
        )  # fmt: skip
        if listed == self._prefill_listed:
            return
        rows = [
            {"name": n, "address": host, "port": port, "labels": {ROLE_LABEL: "prefill"}}
            for n, port in listed
        ]
        _write_atomically(self.prefill_file, json.dumps(rows, indent=2) + "\n")
        self._prefill_listed = listed
        self._listed_at = self.clock()

    async def _adopt(self) -> None:
        if not self.statefile.exists():
            return
        try:
            records = decode(self.statefile.read_text(), str(self.statefile))
        except Exception as e:  # a damaged statefile must not stop the EPP
            log.error("planner: %s; starting without adopted replicas", e)
            records = []
        for rec in records:
            self._next = max(self._next, _suffix(rec.name) + 1)
            if rec.role not in self.roles:
                log.warning(
                    "planner: %s has role %s, not in this pool; left alone", rec.name, rec.role
                )
                continue
            server = _runs(rec.pid, rec.argv)
            sidecar = not rec.sidecar_pid or _runs(rec.sidecar_pid, rec.sidecar_argv)
            if rec.sidecar_pid and server != sidecar:
                log.warning(
                    "planner: %s has lost its %s; stopping the rest", rec.name,
                    "sidecar" if server else "decode server",
                )  # fmt: skip
                await self._terminate(Worker(rec, DRAINING))
                continue
            same = server and sidecar
            if same and await self._healthy(rec):
                w = self._workers[rec.name] = Worker(rec, READY)
                self.datastore.add_endpoint(self._endpoint(rec))
                log.info("planner: adopted %s (pid %d, port %d)", rec.name, rec.pid, rec.port)
                if rec.draining:  # the last leader's drain, carried on
                    self._begin_drain(w)
            elif same:
                log.warning(
                    "planner: %s (pid %d) runs but is not healthy; stopping it", rec.name, rec.pid
                )
                await self._terminate(Worker(rec, DRAINING))
        self._save()


def _popen(
    argv: list[str], log_path: Path, *, start_new_session: bool = False, pgid: int | None = None
) -> subprocess.Popen[bytes]:
    with open(log_path, "wb") as out:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=start_new_session,
            process_group=pgid,
        )


def _write_atomically(path: Path, text: str) -> None:
    """Temporary file + rename: a reader sees the old text or the new, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _suffix(name: str) -> int:
    tail = name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1
