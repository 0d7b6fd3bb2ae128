"""How fast Kubernetes discovery follows pods: API-server write → datastore membership.

    .venv/bin/python bench/k8s_discovery.py [--pods 50] [--rounds 200]

No real API server runs here: the server is the fake one of the tests
(tests/fake_kube.py, aiohttp on loopback, chunked watch streams). The EPP side is the real
`KubernetesDiscovery` (official `kubernetes` client in its reflector threads → the pure
pod → endpoint mapping → `call_soon_threadsafe` → `Datastore.set_endpoints`). Both run in
this one process, so the figure is the client's own path plus loopback HTTP, and a real
API server's watch-cache fan-out latency comes on top.

Each round makes one change (a pod joins, turns unready, turns Ready again, or leaves,
in rotation) in a pool of `--pods` Ready pods and times until the datastore shows it.
Prints the median, p90, p99 and max in milliseconds per kind of change.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from epp.datalayer.k8s_discovery import KubernetesDiscovery, KubeSource, load_api_client
from epp.datastore import Datastore
from tests.fake_kube import FakeKubeAPI

POOL = {"selector": {"matchLabels": {"app": "vllm"}}, "targetPorts": [{"number": 8000}]}
LABELS = {"app": "vllm"}
EXTRA = "extra"  # the pod that comes and goes


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


async def wait_until(pred, timeout: float = 10.0) -> float:
    start = time.perf_counter()
    while not pred():
        if time.perf_counter() - start > timeout:
            raise SystemExit("discovery did not follow a change within 10 s")
        await asyncio.sleep(0)  # yield only: the sample is not rounded up to a sleep
    return time.perf_counter() - start


async def main(pods: int, rounds: int) -> None:
    fake = FakeKubeAPI()
    await fake.start()
    for i in range(pods):
        fake.put_pod(f"p{i}", f"10.0.{i // 250}.{i % 250 + 1}", LABELS)
    fake.put_pool("pool", POOL)
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = fake.kubeconfig(Path(tmp) / "kubeconfig")
        ds = Datastore(require_metrics=False)
        d = KubernetesDiscovery(
            KubeSource(namespace="default", pool_name="pool"), ds, load_api_client(kubeconfig)
        )
        await d.start()
        await wait_until(lambda: len(ds) == pods)
        samples: dict[str, list[float]] = {"join": [], "unready": [], "ready": [], "leave": []}
        for r in range(rounds):
            kind = ["join", "unready", "ready", "leave"][r % 4]
            if kind == "join":
                fake.put_pod(EXTRA, "10.9.9.9", LABELS)
                samples[kind].append(await wait_until(lambda: ds.get(EXTRA) is not None))
            elif kind == "unready":
                fake.put_pod(EXTRA, "10.9.9.9", LABELS, ready=False)
                samples[kind].append(await wait_until(lambda: ds.get(EXTRA) is None))
            elif kind == "ready":
                fake.put_pod(EXTRA, "10.9.9.9", LABELS)
                samples[kind].append(await wait_until(lambda: ds.get(EXTRA) is not None))
            else:
                fake.delete_pod(EXTRA)
                samples[kind].append(await wait_until(lambda: ds.get(EXTRA) is None))
        await d.stop()
    await fake.stop()
    print(f"pool of {pods} Ready pods, {rounds} changes; milliseconds from write to datastore")
    print(f"{'change':8} {'n':>4} {'median':>8} {'p90':>8} {'p99':>8} {'max':>8}")
    for kind, v in samples.items():
        ms = [x * 1000 for x in v]
        print(
            f"{kind:8} {len(ms):4d} {statistics.median(ms):8.2f} {pct(ms, 0.9):8.2f}"
            f" {pct(ms, 0.99):8.2f} {max(ms):8.2f}"
        )


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pods", type=int, default=50)
    p.add_argument("--rounds", type=int, default=200)
    a = p.parse_args()
    asyncio.run(main(a.pods, a.rounds))
