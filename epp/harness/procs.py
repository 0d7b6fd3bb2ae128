"""Child processes for `epp demo`, e2e tests and benchmarks, and the guarantee they all die.

A `ProcessGroup` starts children (Envoy, simulators, the EPP, ext_proc baselines), waits until
each is ready, and stops everything it started: SIGTERM, then SIGKILL after a grace period. It
does so on normal exit, on exceptions, on Ctrl-C (KeyboardInterrupt), on SIGTERM of the parent
(turned into SystemExit so `with` blocks unwind) and at interpreter exit (atexit). On Linux every
child also gets SIGTERM from the kernel if the parent is SIGKILLed (PR_SET_PDEATHSIG).

Every child runs in its own session (hence its own process group), so the terminal's Ctrl-C does
not hit children in random order, and stopping a child also stops its own children.
Output (stdout + stderr) goes to `<run_dir>/<name>.log`; an early death or a readiness timeout
raises an error naming the child and quoting the tail of that log.

    with ProcessGroup() as pg:
        envoy = pg.start("envoy", argv, ready=HttpReady("http://127.0.0.1:9901/ready"))
        ...
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from epp.procs import astop_then_kill, signal_group, stop_then_kill
from epp.procs import free_port as free_port  # re-exported: the harness's callers use it
from epp.procs import free_port_range as free_port_range

DEFAULT_GRACE_S = 5.0
DEFAULT_READY_TIMEOUT_S = 30.0
_POLL_S = 0.05
_TAIL_LINES = 40


class ProcessError(RuntimeError):
    """A child died or never became ready; the message names it and quotes its log."""


# ---------------------------------------------------------------- readiness conditions


class Readiness(Protocol):
    """Something cheap and non-blocking-ish (sub-second) to poll until it returns True."""

    def probe(self, proc: ManagedProcess) -> bool: ...

    def describe(self) -> str: ...


@dataclass(frozen=True, slots=True)
class PortReady:
    """Ready when a TCP connect succeeds: the child has bound and listens."""

    port: int
    host: str = "127.0.0.1"

    def probe(self, proc: ManagedProcess) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def describe(self) -> str:
        return f"tcp {self.host}:{self.port} accepting"


# Probes target local children: an http_proxy from the environment must not intercept them.
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True, slots=True)
class HttpReady:
    """Ready when GET url answers `status` (and the body contains `body_contains`, if given)."""

    url: str
    status: int = 200
    body_contains: str | None = None

    def probe(self, proc: ManagedProcess) -> bool:
        try:
            with _NO_PROXY.open(self.url, timeout=1.0) as resp:
                code, body = resp.status, resp.read()
        except urllib.error.HTTPError as e:
            code, body = e.code, b""
        except (OSError, ValueError):
            return False
        if code != self.status:
            return False
        return self.body_contains is None or self.body_contains.encode() in body

    def describe(self) -> str:
        extra = f" containing {self.body_contains!r}" if self.body_contains else ""
        return f"GET {self.url} -> {self.status}{extra}"


@dataclass(frozen=True, slots=True)
class LogReady:
    """Ready when a line of the child's output matches `pattern` (re.search)."""

    pattern: str

    def probe(self, proc: ManagedProcess) -> bool:
        return re.search(self.pattern, proc.output(), re.MULTILINE) is not None

    def describe(self) -> str:
        return f"output line matching {self.pattern!r}"


@dataclass(frozen=True, slots=True)
class AllReady:
    """Ready when every condition is (e.g. Envoy: admin says LIVE *and* the listener accepts)."""

    conditions: tuple[Readiness, ...]

    def __init__(self, *conditions: Readiness) -> None:
        object.__setattr__(self, "conditions", conditions)

    def probe(self, proc: ManagedProcess) -> bool:
        return all(c.probe(proc) for c in self.conditions)

    def describe(self) -> str:
        return " and ".join(c.describe() for c in self.conditions)


# ---------------------------------------------------------------- one child


@dataclass(eq=False)
class ManagedProcess:
    """One started child. `stop()` is idempotent; the group stops it anyway at exit."""

    name: str
    argv: tuple[str, ...]
    log_path: Path
    popen: subprocess.Popen[bytes] = field(repr=False)
    grace_s: float = DEFAULT_GRACE_S
    # Set once the group has been SIGKILLed and the leader reaped: never signal that pgid
    # again, the kernel may have handed the number to an unrelated process by now.
    finished: bool = field(default=False, repr=False)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def alive(self) -> bool:
        return self.popen.poll() is None

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def tail(self, lines: int = _TAIL_LINES) -> str:
        return "\n".join(self.output().splitlines()[-lines:])

    def died_error(self, while_doing: str) -> ProcessError:
        return ProcessError(
            f"{self.name} (pid {self.pid}) exited with code {self.returncode} {while_doing}; "
            f"last lines of {self.log_path}:\n{self.tail()}"
        )

    def signal_group(self, sig: int) -> None:
        """Signal the child's whole process group (it leads its own session)."""
        if not self.finished:
            signal_group(self.pid, sig)

    def stop(self) -> int | None:
        _stop_all([self], self.grace_s)
        return self.returncode

    async def astop(self) -> int | None:
        await _astop_all([self], self.grace_s)
        return self.returncode


# ---------------------------------------------------------------- the group


class ProcessGroup:
    """Starts children, waits for readiness, and stops all of them no matter how we leave.

    `run_dir` holds one log per child; when not given, a temporary directory is used and removed
    on close (errors quote the log tail, so nothing is lost).
    """

    def __init__(self, run_dir: str | Path | None = None, *, grace_s: float = DEFAULT_GRACE_S):
        self._own_dir = run_dir is None
        self.run_dir = Path(tempfile.mkdtemp(prefix="epp-run-") if run_dir is None else run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.grace_s = grace_s
        self.processes: list[ManagedProcess] = []
        self._closed = False
        _install_parent_handlers()
        _LIVE_GROUPS.add(self)

    # -- starting

    def spawn(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
    ) -> ManagedProcess:
        """Start a child without waiting for it (see `start` / `astart` for that)."""
        if self._closed:
            raise RuntimeError("ProcessGroup is closed")
        if any(p.name == name for p in self.processes):
            raise ValueError(f"a child named {name!r} already exists in this group")
        log_path = self.run_dir / f"{name}.log"
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        with open(log_path, "wb") as log:
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=full_env,
                cwd=cwd,
                start_new_session=True,
                preexec_fn=_pdeathsig_preexec(),
            )
        proc = ManagedProcess(name, tuple(argv), log_path, popen, self.grace_s)
        self.processes.append(proc)
        return proc

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        ready: Readiness | None = None,
        timeout: float = DEFAULT_READY_TIMEOUT_S,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
    ) -> ManagedProcess:
        """Start a child and block until `ready` holds; raise ProcessError if it dies first."""
        proc = self.spawn(name, argv, env=env, cwd=cwd)
        if ready is not None:
            wait_ready(proc, ready, timeout)
        return proc

    async def astart(
        self,
        name: str,
        argv: Sequence[str],
        *,
        ready: Readiness | None = None,
        timeout: float = DEFAULT_READY_TIMEOUT_S,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
    ) -> ManagedProcess:
        """`start` for event-loop code: probes run in a thread so in-loop servers keep serving."""
        proc = self.spawn(name, argv, env=env, cwd=cwd)
        if ready is not None:
            await await_ready(proc, ready, timeout)
        return proc

    def get(self, name: str) -> ManagedProcess:
        for p in self.processes:
            if p.name == name:
                return p
        raise KeyError(name)

    def check(self) -> None:
        """Raise ProcessError if any child has exited; call it when a request fails oddly."""
        for p in self.processes:
            if not p.alive():
                raise p.died_error("unexpectedly")

    # -- stopping

    def close(self) -> None:
        """Stop every child (newest first get the signal first) and forget them."""
        self._closed = True
        _stop_all(list(reversed(self.processes)), self.grace_s)
        self._cleanup()

    async def aclose(self) -> None:
        self._closed = True
        await _astop_all(list(reversed(self.processes)), self.grace_s)
        self._cleanup()

    def _cleanup(self) -> None:
        _LIVE_GROUPS.discard(self)
        if self._own_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> ProcessGroup:
        return self

    async def __aexit__(self, *exc: object) -> None:
        # Shield: a cancelled test/demo must still reap its children.
        await asyncio.shield(self.aclose())


# ---------------------------------------------------------------- waiting


def pid_runs(pid: int) -> bool:
    """Whether `pid` is a live process; a zombie counts as stopped (it has exited, only its
    parent has not reaped it yet), which is what a test asking "did it stop?" means."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes() != b""
    except (FileNotFoundError, ProcessLookupError):
        return False


def wait_until(cond: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Poll `cond` until it holds; AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(_POLL_S)


def wait_ready(proc: ManagedProcess, ready: Readiness, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if not proc.alive():
            raise proc.died_error(f"before becoming ready ({ready.describe()})")
        if ready.probe(proc):
            return
        if time.monotonic() > deadline:
            raise _timeout_error(proc, ready, timeout)
        time.sleep(_POLL_S)


async def await_ready(proc: ManagedProcess, ready: Readiness, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if not proc.alive():
            raise proc.died_error(f"before becoming ready ({ready.describe()})")
        if await asyncio.to_thread(ready.probe, proc):
            return
        if time.monotonic() > deadline:
            raise _timeout_error(proc, ready, timeout)
        await asyncio.sleep(_POLL_S)


def _timeout_error(proc: ManagedProcess, ready: Readiness, timeout: float) -> ProcessError:
    return ProcessError(
        f"{proc.name} (pid {proc.pid}) not ready after {timeout:.0f}s "
        f"(waiting for {ready.describe()}); last lines of {proc.log_path}:\n{proc.tail()}"
    )


# ---------------------------------------------------------------- stopping (shared)


def _terminate(procs: Sequence[ManagedProcess]) -> None:
    for p in procs:
        if p.alive():
            p.signal_group(signal.SIGTERM)


def _kill_leftovers(procs: Sequence[ManagedProcess]) -> None:
    """SIGKILL whatever is left, including grandchildren whose leader already exited."""
    for p in procs:
        p.signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.popen.wait(timeout=5)
            p.finished = True


def _stop_all(procs: Sequence[ManagedProcess], grace_s: float) -> None:
    stop_then_kill(
        lambda: _terminate(procs),
        lambda: _kill_leftovers(procs),
        lambda: any(p.alive() for p in procs),
        grace_s,
    )


async def _astop_all(procs: Sequence[ManagedProcess], grace_s: float) -> None:
    await astop_then_kill(
        lambda: _terminate(procs),
        lambda: _kill_leftovers(procs),
        lambda: any(p.alive() for p in procs),
        grace_s,
    )


# ---------------------------------------------------------------- parent death


# Strong references: a group nobody holds any more must still be stopped at exit.
_LIVE_GROUPS: set[ProcessGroup] = set()
_handlers_installed = False


def _stop_live_groups() -> None:
    for group in list(_LIVE_GROUPS):
        group.close()


def _on_sigterm(signum: int, frame: object) -> None:
    # Unwind like Ctrl-C does, so `with ProcessGroup()` blocks and atexit run their cleanup.
    raise SystemExit(128 + signum)


def _install_parent_handlers() -> None:
    """atexit always; SIGTERM only if nobody else handles it and we are on the main thread."""
    global _handlers_installed
    if _handlers_installed:
        return
    _handlers_installed = True
    atexit.register(_stop_live_groups)
    on_main = threading.current_thread() is threading.main_thread()
    if on_main and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)


_PR_SET_PDEATHSIG = 1


def _pdeathsig_preexec() -> Callable[[], None] | None:
    """Have the kernel SIGTERM the child if we die without cleaning up (Linux only).

    The death signal fires when the *thread* that forked exits, so it is only armed when
    spawning from the main thread; the libc handle is resolved here, not in the forked child.
    """
    if os.uname().sysname != "Linux":
        return None
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    sig = int(signal.SIGTERM)

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:  # parent already gone between fork and prctl
            os.kill(os.getpid(), signal.SIGTERM)

    return arm
