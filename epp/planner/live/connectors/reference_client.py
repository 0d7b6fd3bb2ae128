"""`epp planner-client`: a reference environment for `environment: virtual`. It watches
a planner's VirtualPlanner service (proto/planner.proto), carries each decision out
with `epp sim` processes (or any command template), publishes the ready replicas as an
endpoints file that `epp serve --endpoints FILE` watches, and completes the decision.

This is the other half of Dynamo's VirtualConnector (`VirtualConnectorClient`:
`wait`, `get`, act, `complete`, reference §6.1) shipped as a working example: an
environment that owns its endpoints. The processes are the local connector's
(`local.LocalConnector`: a command per role, a health check before a replica counts,
P/D sidecars, a statefile), over a private datastore; the EPP learns the pool from the
file, so for one decision:

1. scale up: start the new replicas; once healthy they are added to the file;
2. scale down: the victims leave the file first (the EPP's file watch stops routing
   to them), then after `drain_s` they are stopped; `drain_s` should cover the longest
   request, since this environment cannot see the EPP's in-flight counts;
3. `Complete(decision_id)` once the file says what the decision asked for.

An aggregated pool's count is `num_decode_workers` (`num_prefill_workers` is -1).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import grpc

from epp.datastore import ROLE_LABEL, Datastore
from epp.planner.core.config import LiveParams
from epp.planner.core.types import Role
from epp.planner.live.connectors.client import VirtualClient
from epp.planner.live.connectors.local import LocalConnector

log = logging.getLogger("epp.planner.client")


def targets_of(roles: Sequence[Role], num_prefill: int, num_decode: int) -> dict[Role, int]:
    """A published decision's counts per role (-1: not set, left as is)."""
    if tuple(roles) == (Role.AGGREGATED,):
        return {Role.AGGREGATED: num_decode} if num_decode >= 0 else {}
    got = {Role.PREFILL: num_prefill, Role.DECODE: num_decode}
    return {r: n for r, n in got.items() if n >= 0}


class SimEnvironment:
    """Carries decisions out on this machine. `run()` watches until cancelled."""

    def __init__(
        self,
        address: str,
        endpoints_file: str | Path,
        params: LiveParams,
        roles: Sequence[Role],
        *,
        pool: str = "virtual-env",
        drain_s: float = 5.0,
    ) -> None:
        self.address = address
        self.endpoints_file = Path(endpoints_file)
        self.roles = tuple(roles)
        self.drain_s = drain_s
        self.datastore = Datastore()
        self.connector = LocalConnector(self.datastore, params, self.roles, pool=pool)
        self.completed: list[int] = []  # decision ids carried out, in order

    async def run(self) -> None:
        await self.connector.start()
        self._publish()
        client = VirtualClient(self.address)
        try:
            last = -1
            while True:
                try:
                    async for d in client.watch(last):
                        await self.carry_out(d.num_prefill_workers, d.num_decode_workers)
                        await client.complete(d)
                        self.completed.append(d.decision_id)
                        last = d.decision_id
                        log.info("decision %d carried out: %s", d.decision_id, self.counts())
                except grpc.aio.AioRpcError as e:  # the planner restarts: watch again
                    log.warning("watch ended (%s); again in 1 s", e.code())
                    await asyncio.sleep(1.0)
        finally:
            await client.close()
            await self.connector.stop()
            self._publish()

    async def carry_out(self, num_prefill: int, num_decode: int) -> None:
        targets = targets_of(self.roles, num_prefill, num_decode)
        victims: list[str] = []
        for role, n in targets.items():
            ready = sorted(
                (w.name for w in self.connector.workers() if w.role == role),
                key=lambda name: int(name.rsplit("-", 1)[1]),
                reverse=True,  # the newest go first
            )
            victims += ready[: max(0, len(ready) - n)]
        if victims:  # out of the EPP's pool first, stopped later
            self._publish(exclude=set(victims))
            await asyncio.sleep(self.drain_s)
        for role, n in targets.items():
            await self.connector.set_replicas(role, n, prefer_drain=victims)
        await self.connector.settle()
        self._publish()

    def counts(self) -> dict[str, int]:
        return {r.value: n.ready for r, n in self.connector.replicas().items()}

    def _publish(self, exclude: frozenset[str] | set[str] = frozenset()) -> None:
        """The ready replicas as an endpoints file (written atomically)."""
        rows = [
            {"name": e.name, "address": e.address, "port": e.port,
             **({"labels": {ROLE_LABEL: e.role}} if e.role else {})}
            for e in self.datastore.endpoints()
            if e.name not in exclude
        ]  # fmt: skip
        self.endpoints_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.endpoints_file.with_name(self.endpoints_file.name + ".tmp")
        tmp.write_text(json.dumps(sorted(rows, key=lambda r: r["name"]), indent=2) + "\n")
        os.replace(tmp, self.endpoints_file)


# ---- the command --------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = LiveParams()
    p.add_argument("--planner", required=True, metavar="HOST:PORT",
                   help="the planner's VirtualPlanner service (its virtual-address)")  # fmt: skip
    p.add_argument("--endpoints-file", required=True, metavar="FILE",
                   help="ready replicas go here (epp serve --endpoints FILE)")  # fmt: skip
    p.add_argument("--pool", choices=["aggregated", "disaggregated"], default="aggregated")
    p.add_argument("--worker-command", default=d.worker_command,
                   help=f"one aggregated replica ({d.worker_command!r})")  # fmt: skip
    p.add_argument("--prefill-worker-command", help="one prefill replica (disaggregated)")
    p.add_argument("--decode-worker-command", help="one decode replica (disaggregated)")
    p.add_argument("--state-dir", default="~/.epp/state",
                   help="statefile and replica logs (~/.epp/state)")  # fmt: skip
    p.add_argument("--drain-seconds", type=float, default=5.0,
                   help="between leaving the endpoints file and being stopped (5)")  # fmt: skip
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def environment_from_args(args: argparse.Namespace) -> SimEnvironment:
    """Raises ValueError naming the flag."""
    roles = (Role.AGGREGATED,) if args.pool == "aggregated" else (Role.PREFILL, Role.DECODE)
    for role in roles:
        flag = "worker-command" if role == Role.AGGREGATED else f"{role.value}-worker-command"
        if not getattr(args, flag.replace("-", "_")):
            raise ValueError(f"--{flag} is required for a {args.pool} pool")
    if args.drain_seconds < 0:
        raise ValueError("--drain-seconds must be >= 0")
    params = LiveParams(
        worker_command=args.worker_command,
        prefill_worker_command=args.prefill_worker_command,
        decode_worker_command=args.decode_worker_command,
        statefile=str(Path(args.state_dir) / "{pool}.json"),
    )
    return SimEnvironment(args.planner, args.endpoints_file, params, roles,
                          drain_s=args.drain_seconds)  # fmt: skip


async def _main(env: SimEnvironment) -> None:
    task = asyncio.ensure_future(env.run())
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    print(f"epp planner-client: watching {env.address}, writing {env.endpoints_file}", flush=True)
    with contextlib.suppress(asyncio.CancelledError):
        await task


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        env = environment_from_args(args)
    except ValueError as e:
        print(f"epp planner-client: {e}", file=sys.stderr)
        return 2
    asyncio.run(_main(env))
    return 0
