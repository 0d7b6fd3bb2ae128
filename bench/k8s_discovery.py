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
Prints the median, p90, p99 and max in milliseconds per kind of change, for the
discovery as shipped (`memo`: `PodMapper` re-maps only pods whose resourceVersion changed)
and with every event re-mapping the whole pool (`full`: `pods_to_endpoints`), measured in
one run, alternating `--repeats` times so drift on a shared machine hits both alike.
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
from epp.datalayer.k8s_pods import pods_to_endpoints
from epp.datastore import Datastore
from tests.fake_kube import FakeKubeAPI

POOL = {"selector": {"matchLabels": {"app": "vllm"}}, "targetPorts": [{"number": 8000}]}
LABELS = {"app": "vllm"}
EXTRA = "extra"  # the pod that comes and goes


class FullMapper:
    """Re-maps every pod on every event (what PodMapper replaced)."""

    def map(self, pods, ports):
        return pods_to_endpoints(pods.values(), ports)


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


async def measure(pods: int, rounds: int, mode: str) -> dict[str, list[float]]:
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
        if mode == "full":
            d._mapper = FullMapper()  # type: ignore[assignment]
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
    return samples


async def main(pods: int, rounds: int, repeats: int) -> None:
    results: dict[str, dict[str, list[float]]] = {}
    for _ in range(repeats):
        for mode in ("memo", "full"):
            got = await measure(pods, rounds, mode)
            for kind, v in got.items():
                results.setdefault(mode, {}).setdefault(kind, []).extend(v)
    print(f"pool of {pods} Ready pods; milliseconds from write to datastore")
    print(f"{'mode':5} {'change':8} {'n':>4} {'median':>8} {'p90':>8} {'p99':>8} {'max':>8}")
    for mode, samples in results.items():
        for kind, v in samples.items():
            ms = [x * 1000 for x in v]
            print(
                f"{mode:5} {kind:8} {len(ms):4d} {statistics.median(ms):8.2f}"
                f" {pct(ms, 0.9):8.2f} {pct(ms, 0.99):8.2f} {max(ms):8.2f}"
            )
    for kind in results["memo"]:
        ratio = statistics.median(results["full"][kind]) / statistics.median(results["memo"][kind])
        print(f"{kind}: full / memo median = {ratio:.1f}x")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pods", type=int, default=50)
    p.add_argument("--rounds", type=int, default=200, help="changes per mode and repeat")
    p.add_argument("--repeats", type=int, default=2)
    a = p.parse_args()
    asyncio.run(main(a.pods, a.rounds, a.repeats))
