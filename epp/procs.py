"""Process primitives the product and the harness share: free ports, and stopping a
process group (SIGTERM, a grace period, then SIGKILL).

The planner's local connector (epp/planner/live/connectors/local.py) stops the model
servers it started, the harness (epp/harness/procs.py) stops Envoy, simulators and EPPs;
both stop a group the same way, with this code. Stopping the whole group, not the pid,
also stops a child's own children (a decode server's sidecar, a shell's command).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import time
from collections.abc import Callable

POLL_S = 0.05


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago.

    Racy by nature (someone may grab it before the child binds it); good enough for tests and
    local runs, where a collision shows up as a clear "child died" error with the bind failure.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_port_range(n: int, host: str = "0.0.0.0") -> int:
    """A base port p with p .. p+n-1 all free a moment ago (`epp sim --replicas n`, KV-event
    ports per replica). Drawn below Linux's ephemeral range (32768+), where `free_port`'s
    and every client socket's ports come from, so a neighbour of a free port is not taken
    by the next outgoing connection; racy in the same way as `free_port` otherwise."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 32768 - n)
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + n):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.bind((host, port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports in 20000-32767")


def signal_group(pgid: int, sig: int) -> None:
    """Signal a process group; one already gone (or not ours any more) is no error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stop_then_kill(
    terminate: Callable[[], None],
    kill: Callable[[], None],
    running: Callable[[], bool],
    grace_s: float,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """`terminate()`, wait up to `grace_s` while `running()`, then `kill()` regardless
    (it reaps grandchildren whose leader already exited)."""
    deadline = _begin(terminate, clock, grace_s)
    while running() and clock() < deadline:
        time.sleep(POLL_S)
    kill()


async def astop_then_kill(
    terminate: Callable[[], None],
    kill: Callable[[], None],
    running: Callable[[], bool],
    grace_s: float,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """`stop_then_kill` on an event loop: the grace period does not block it."""
    deadline = _begin(terminate, clock, grace_s)
    while running() and clock() < deadline:
        await asyncio.sleep(POLL_S)
    kill()


def _begin(terminate: Callable[[], None], clock: Callable[[], float], grace_s: float) -> float:
    terminate()
    return clock() + grace_s
