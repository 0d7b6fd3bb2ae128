"""How long the planner goes without a leader when the leader dies: the lock file (two
`epp serve --planner` processes, SIGKILL the leader) and the Kubernetes Lease (two
`LeaseElector`s against tests/fake_kube.py, a FAKE API server on loopback; the leader's
thread stops without releasing, as a crash).

- lock file: from the SIGKILL until the follower's log says it took over (its retry
  period `--retry` bounds the wait for the lock; its planner tick, 0.2 s here, adds to it).
- Lease: from the leader's last successful renewal until the follower leads; client-go's
  algorithm makes that a lease duration (the follower must see no change for that long)
  plus up to two retry periods (one until its next read sees the last renewal, one until
  the read that finds it expired), plus request latency.

    .venv/bin/python bench/leader_failover.py [--repeats 3] [--lease 3 --renew 2 --retry 0.5]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from epp.harness.procs import LogReady, ProcessGroup, free_port
from epp.planner.live.connectors.statefile import decode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.fake_kube


def lock_file_once(retry: float) -> float:
    with tempfile.TemporaryDirectory() as tmp, ProcessGroup() as pg:
        statefile = Path(tmp) / "state.json"
        cfg = Path(tmp) / "planner.yaml"
        cfg.write_text(
            "mode: load\nmin-endpoint: 1\nadjustment-interval: 30\nmetric-pulling-interval: 0.2\n"
            f"worker-command: epp sim --port {{port}}\nstatefile: {json.dumps(str(statefile))}\n"
        )

        def start(name: str, ready: str):
            argv = [sys.executable, "-m", "epp.cli", "serve", "--host", "127.0.0.1",
                    "--grpc-port", str(free_port()), "--health-port", str(free_port()),
                    "--metrics-port", str(free_port()), "--planner", str(cfg),
                    "--leader-retry-period", str(retry), "--leader-renew-deadline",
                    str(retry * 2), "--leader-lease-duration", str(retry * 3)]  # fmt: skip
            return pg.start(name, argv, ready=LogReady(ready), timeout=300)

        try:
            leader = start("a", r"planner: \S+ ready")
            follower = start("b", r"is a follower")
            leader.popen.send_signal(signal.SIGKILL)
            t0 = time.monotonic()
            while "leads: taking over" not in follower.output():
                if time.monotonic() - t0 > 120:
                    raise TimeoutError("the follower never took over")
                time.sleep(0.01)
            took = time.monotonic() - t0
            follower.popen.send_signal(signal.SIGTERM)
            follower.popen.wait(timeout=90)
            return took
        finally:
            for w in decode(statefile.read_text()) if statefile.exists() else []:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(w.pid, signal.SIGKILL)


async def lease_once(lease: float, renew: float, retry: float) -> float:
    from epp.datalayer.k8s_discovery import load_api_client
    from epp.election.lease import LeaseElector, LeaseTiming
    from tests.fake_kube import FakeKubeAPI

    fake = FakeKubeAPI()
    await fake.start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            kubeconfig = fake.kubeconfig(Path(tmp) / "kubeconfig")
            timing = LeaseTiming(lease, renew, retry)
            a, b = (LeaseElector(load_api_client(kubeconfig), "default", "bench", n, timing)
                    for n in ("a", "b"))  # fmt: skip
            await a.start()
            while not a.is_leader():
                await asyncio.sleep(0.01)
            await b.start()
            await asyncio.sleep(2 * retry)  # b has seen a's lease renewed
            renewed = a._renewed_at
            await a.stop(release=False)  # a crash: no release, no more renewals
            assert renewed is not None
            while not b.is_leader():
                await asyncio.sleep(0.01)
            took = time.monotonic() - (a._renewed_at or renewed)
            both = a.is_leader() and b.is_leader()
            await b.stop()
            if both:
                raise AssertionError("two leaders at once")
            return took
    finally:
        await fake.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--lease", type=float, default=3.0)
    ap.add_argument("--renew", type=float, default=2.0)
    ap.add_argument("--retry", type=float, default=0.5)
    ap.add_argument("--skip-lock-file", action="store_true")
    args = ap.parse_args(argv)
    load = os.getloadavg()
    leases = [asyncio.run(lease_once(args.lease, args.renew, args.retry))
              for _ in range(args.repeats)]  # fmt: skip
    locks = [] if args.skip_lock_file else [lock_file_once(args.retry)
                                           for _ in range(args.repeats)]  # fmt: skip
    print(f"load average before {load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f}, "
          f"after {'/'.join(f'{x:.2f}' for x in os.getloadavg())}")  # fmt: skip
    print("| election | settings | without a leader: median (min-max) | bound |")
    print("|---|---|---|---|")
    print(f"| Kubernetes Lease (fake API server) | lease {args.lease:g} s, renew "
          f"{args.renew:g} s, retry {args.retry:g} s | {statistics.median(leases):.2f} s "
          f"({min(leases):.2f}-{max(leases):.2f}) | lease + 2 x retry = "
          f"{args.lease + 2 * args.retry:g} s |")  # fmt: skip
    if locks:
        print(f"| lock file (2 processes, SIGKILL) | retry {args.retry:g} s, planner tick 0.2 s "
              f"| {statistics.median(locks):.2f} s ({min(locks):.2f}-{max(locks):.2f}) | "
              f"retry + tick = {args.retry + 0.2:g} s (+ start-up of the take-over) |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
