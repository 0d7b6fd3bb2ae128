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
from pathlib import Path

POLL_S = 0.05


# The ports handed out lately: a child binds within seconds, so remembering the last few
# thousand is enough, and a long-lived `epp serve --planner` that starts replicas for
# months never runs out of ports to hand out.
_RECENT_PORTS = 4096
_HANDED_OUT: dict[int, None] = {}  # insertion-ordered: the oldest is forgotten first
_LOW_PORT = 10000


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (Linux default 32768-60999)."""
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[:2]
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999


def _listen_range(n: int) -> range:
    """Where to draw listening ports: below the ephemeral range, so no client socket the
    kernel opens meanwhile (a test's HTTP call, Envoy's upstream connection) can take the
    port between our check and the child's bind; above it if the range starts too low."""
    lo, hi = _ephemeral_range()
    if lo - _LOW_PORT >= 4096:
        return range(_LOW_PORT, lo - n)
    return range(hi + 1, 65536 - n)


def free_port_range(n: int, host: str = "0.0.0.0") -> int:
    """A base port p with p .. p+n-1 all free a moment ago and not handed out before by this
    process (`epp sim --replicas n`, KV-event ports per replica).

    Drawn outside the kernel's ephemeral range: a port that was free there could be taken by
    the next outgoing connection before the child binds it, which showed up as an occasional
    "address already in use" in test runs with many connections. Still racy against another
    process drawing the same number, which is rare among ~20k ports."""
    candidates = _listen_range(n)
    rng = random.Random()
    for _ in range(500):
        base = rng.choice(candidates)
        ports = range(base, base + n)
        if any(p in _HANDED_OUT for p in ports):
            continue
        socks: list[socket.socket] = []
        try:
            for port in ports:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.bind((host, port))
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
        for port in ports:
            _HANDED_OUT[port] = None
        while len(_HANDED_OUT) > _RECENT_PORTS:
            del _HANDED_OUT[next(iter(_HANDED_OUT))]
        return base
    raise RuntimeError(
        f"no {n} consecutive free ports in {candidates.start}-{candidates.stop + n - 1}"
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A listening port that was free a moment ago (see `free_port_range` for why it is
    drawn outside the ephemeral range); a collision with another process still shows up as
    a clear "child died" error naming the bind failure."""
    return free_port_range(1, host)


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
