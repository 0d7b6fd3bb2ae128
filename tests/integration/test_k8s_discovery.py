"""Kubernetes endpoint discovery against a FAKE API server.

No real Kubernetes API server can run on the test machine. `tests/fake_kube.py` is an
aiohttp server on loopback that serves pods and InferencePools the way the real one does
to a list/watch client (resourceVersions, paged lists, chunked watch streams of JSON
events, BOOKMARK events, an ERROR/410 event for a too-old resourceVersion, 403 Forbidden
and 404 Status bodies). The EPP side is the real code: the official `kubernetes` client
in the reflector threads, the pure pod → endpoint mapping, the real `Datastore`, and for
the end-to-end test a real `epp serve` process given only `--kubeconfig` and the pool flags.

Waits poll for the change with a generous deadline (tests/eventually.py): none asserts how
long a change took, which a loaded machine decides.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from epp.datalayer.k8s_discovery import KubernetesDiscovery, KubeSource, load_api_client
from epp.datalayer.k8s_pods import PoolSpec
from epp.datalayer.k8s_reflector import WatchTiming
from epp.datastore import Datastore, Endpoint, EndpointMetrics
from tests.eventually import eventually
from tests.fake_kube import FakeKubeAPI

NS = "llm"
POOL = {"selector": {"matchLabels": {"app": "vllm"}}, "targetPorts": [{"number": 8000}]}
FAST = WatchTiming(backoff_initial=0.05, backoff_max=0.2)
ROLE = {"app": "vllm", "llm-d.ai/role": "decode"}


def names(ds: Datastore) -> list[str]:
    return sorted(e.name for e in ds.endpoints())


@pytest.fixture
async def fake() -> AsyncIterator[FakeKubeAPI]:
    api = FakeKubeAPI()
    await api.start()
    yield api
    await api.stop()


@pytest.fixture
def kubeconfig(fake: FakeKubeAPI, tmp_path: Path) -> str:
    return fake.kubeconfig(tmp_path / "kubeconfig", NS)


class Running:
    """A KubernetesDiscovery over a fresh datastore; stopped by the fixture."""

    def __init__(self) -> None:
        self.started: list[KubernetesDiscovery] = []

    async def __call__(
        self, kubeconfig: str, ds: Datastore | None = None, **source: object
    ) -> tuple[KubernetesDiscovery, Datastore]:
        ds = ds or Datastore(require_metrics=False)
        src = KubeSource(namespace=NS, timing=FAST, **source)  # type: ignore[arg-type]
        d = KubernetesDiscovery(src, ds, load_api_client(kubeconfig))
        await d.start()
        self.started.append(d)
        return d, ds


@pytest.fixture
async def discover() -> AsyncIterator[Running]:
    running = Running()
    yield running
    for d in running.started:
        await d.stop()


async def test_pods_join_and_leave_as_the_watch_reports_them(fake, kubeconfig, discover) -> None:
    fake.put_pool("pool-a", POOL, ns=NS)
    fake.put_pod("a", "10.0.0.1", ROLE, ns=NS)
    fake.put_pod("b", "10.0.0.2", ROLE, ready=False, ns=NS)
    fake.put_pod("other", "10.0.0.9", {"app": "sglang"}, ns=NS)  # not selected
    _, ds = await discover(kubeconfig, pool_name="pool-a")
    await eventually(lambda: names(ds) == ["a"], what="initial list")
    assert ds.get("a") == Endpoint("a", "10.0.0.1", 8000, ROLE)
    ds.update_metrics("a", EndpointMetrics(waiting_queue_size=3))

    steps = [
        ("c joins", lambda: fake.put_pod("c", "10.0.0.3", ROLE, ns=NS), ["a", "c"]),
        ("b turns Ready", lambda: fake.put_pod("b", "10.0.0.2", ROLE, ns=NS), ["a", "b", "c"]),
        (
            "a terminates",
            lambda: fake.put_pod("a", "10.0.0.1", ROLE, terminating=True, ns=NS),
            ["b", "c"],
        ),
        ("c is deleted", lambda: fake.delete_pod("c", ns=NS), ["b"]),
        (
            "b turns unready",
            lambda: fake.put_pod("b", "10.0.0.2", ROLE, ready=False, ns=NS),
            [],
        ),
    ]
    for what, change, expected in steps:
        if what == "a terminates":  # a stayed through the joins: it kept its metrics
            (snap,) = [s for s in ds.snapshot() if s.name == "a"]
            assert snap.metrics.waiting_queue_size == 3
        change()
        await eventually(lambda e=expected: names(ds) == e, what)


async def test_too_old_resource_version_gets_410_and_the_client_relists(
    fake, kubeconfig, discover
) -> None:
    fake.put_pool("pool-a", POOL, ns=NS)
    fake.put_pod("a", "10.0.0.1", ROLE, ns=NS)
    fake.put_pod("b", "10.0.0.2", ROLE, ns=NS)
    d, ds = await discover(kubeconfig, pool_name="pool-a")
    await eventually(lambda: names(ds) == ["a", "b"])
    assert d.pods.lists == 1
    # In one step (no await): the watch connection drops, a and d change while the client
    # is away, and the server compacts its history past the client's resourceVersion.
    fake.drop_watches()
    fake.delete_pod("a", ns=NS)
    fake.put_pod("d", "10.0.0.4", ROLE, ns=NS)
    fake.compact()
    await eventually(lambda: names(ds) == ["b", "d"], what="state after relist")
    assert fake.gone_sent >= 1  # the re-watch was answered 410 ...
    assert d.pods.lists >= 2  # ... and only a fresh list could have seen a's deletion


async def test_bookmarks_advance_the_resource_version(fake, kubeconfig, discover) -> None:
    fake.put_pool("pool-a", POOL, ns=NS)
    fake.put_pod("a", "10.0.0.1", ROLE, ns=NS)
    d, ds = await discover(kubeconfig, pool_name="pool-a")
    await eventually(lambda: names(ds) == ["a"])
    listed_at = d.pods.resource_version
    for i in range(3):  # changes the pod watch does not select: no events reach it
        fake.put_pod(f"x{i}", "10.0.1.1", {"app": "other"}, ns=NS)
    # Both watches (pool and pods) must be open to get the bookmark.
    await eventually(lambda: fake.watching("pods") == fake.watching("inferencepools") == 1)
    fake.send_bookmarks()
    now = str(fake.rv)
    await eventually(lambda: d.pods.resource_version == now, what="bookmark seen")
    assert int(now) == int(listed_at) + 3
    # History up to now is compacted away; a client that honoured the bookmark re-watches
    # from `now` (not too old), one that ignored it would get 410 and relist.
    fake.compact()
    fake.drop_watches()
    fake.put_pod("b", "10.0.0.2", ROLE, ns=NS)
    await eventually(lambda: names(ds) == ["a", "b"])
    assert fake.gone_sent == 0 and d.pods.lists == 1
    assert d.pool is not None and d.pool.lists == 1
    assert any(f"resourceVersion={now}" in r and "pods" in r for r in fake.requests)


async def test_api_server_outage_keeps_the_pool_and_reconnects(
    fake, kubeconfig, discover, caplog
) -> None:
    caplog.set_level(logging.INFO, logger="epp.datalayer")
    fake.put_pool("pool-a", POOL, ns=NS)
    fake.put_pod("a", "10.0.0.1", ROLE, ns=NS)
    _, ds = await discover(kubeconfig, pool_name="pool-a")
    await eventually(lambda: names(ds) == ["a"])
    await fake.stop()  # the API server goes away: connections refused
    await eventually(lambda: "cannot reach the API server" in caplog.text, what="outage logged")
    assert names(ds) == ["a"]
    fake.put_pod("b", "10.0.0.2", ROLE, ns=NS)
    await fake.start(fake.port)  # back on the same address, with b added meanwhile
    await eventually(lambda: names(ds) == ["a", "b"], what="reconnected")
    await eventually(lambda: "recovered" in caplog.text, what="recovery logged")


async def test_multi_port_pods_are_one_endpoint_per_port(fake, kubeconfig, discover) -> None:
    spec = {**POOL, "targetPorts": [{"number": 8000}, {"number": 8001}]}
    fake.put_pool("pool-a", spec, ns=NS)
    fake.put_pod("dp", "10.0.0.5", ROLE, ns=NS)
    _, ds = await discover(kubeconfig, pool_name="pool-a")
    await eventually(lambda: names(ds) == ["dp-8000", "dp-8001"])
    assert sorted(e.hostport for e in ds.endpoints()) == ["10.0.0.5:8000", "10.0.0.5:8001"]
    fake.put_pool("pool-a", POOL, ns=NS)  # back to one port: the pod's own name
    await eventually(lambda: names(ds) == ["dp"], what="ports change")


async def test_selector_change_on_the_pool_moves_the_pool(fake, kubeconfig, discover) -> None:
    fake.put_pool("pool-a", POOL, ns=NS)
    fake.put_pod("v", "10.0.0.1", {"app": "vllm"}, ns=NS)
    fake.put_pod("s", "10.0.0.2", {"app": "sglang"}, ns=NS)
    _, ds = await discover(kubeconfig, pool_name="pool-a")
    await eventually(lambda: names(ds) == ["v"])
    fake.put_pool("pool-a", {**POOL, "selector": {"matchLabels": {"app": "sglang"}}}, ns=NS)
    await eventually(lambda: names(ds) == ["s"], what="new selector")
    assert fake.count("labelSelector=app%3Dsglang") >= 1


async def test_forbidden_keeps_the_last_pool_and_names_rbac(
    fake, kubeconfig, discover, caplog
) -> None:
    caplog.set_level(logging.INFO, logger="epp.datalayer")
    fake.put_pool("pool-a", POOL, ns=NS)
    fake.put_pod("a", "10.0.0.1", ROLE, ns=NS)
    _, ds = await discover(kubeconfig, pool_name="pool-a")
    await eventually(lambda: names(ds) == ["a"])
    fake.forbid("pods")
    fake.drop_watches()
    fake.delete_pod("a", ns=NS)  # unseen while forbidden
    await eventually(lambda: "forbidden (403)" in caplog.text, what="403 logged")
    line = next(r.getMessage() for r in caplog.records if "forbidden (403)" in r.getMessage())
    assert 'pods is forbidden: User "system:serviceaccount:llm:epp"' in line
    assert "get/list/watch on pods" in line and "keeping the last known pool (1 endpoints)" in line
    assert names(ds) == ["a"]
    fake.forbid("pods", False)  # RBAC fixed: the retry lists again
    await eventually(lambda: names(ds) == [], what="recovery after 403")
    await eventually(lambda: "pods recovered" in caplog.text, what="recovery logged")


async def test_list_without_watch_permission_is_one_error_not_a_flapping_log(
    fake, kubeconfig, discover, caplog
) -> None:
    caplog.set_level(logging.INFO, logger="epp.datalayer")
    fake.put_pool("pool-a", POOL, ns=NS)
    fake.put_pod("a", "10.0.0.1", ROLE, ns=NS)
    fake.forbid("pods", verbs=("watch",))  # a Role with get/list but no watch
    d, ds = await discover(kubeconfig, pool_name="pool-a")
    await eventually(lambda: d.pods.lists >= 4, what="relists with backoff")
    assert names(ds) == ["a"]  # every list succeeds, so the pool is current
    errors = [r.getMessage() for r in caplog.records if "forbidden (403)" in r.getMessage()]
    assert len(errors) == 1 and 'cannot watch resource "pods"' in errors[0]
    assert "pods recovered" not in caplog.text
    fake.forbid("pods", False)
    await eventually(lambda: "pods recovered" in caplog.text, what="recovery")


async def test_missing_pool_and_missing_crd_are_named_and_the_pool_kept(
    fake, kubeconfig, discover, caplog
) -> None:
    caplog.set_level(logging.INFO, logger="epp.datalayer")
    ds = Datastore(require_metrics=False)
    ds.set_endpoints([Endpoint("kept", "10.9.9.9", 8000)])
    fake.put_pod("a", "10.0.0.1", ROLE, ns=NS)
    await discover(kubeconfig, ds, pool_name="missing")
    await eventually(lambda: "InferencePool llm/missing not found" in caplog.text)
    assert "check --pool-name/--pool-namespace" in caplog.text
    assert names(ds) == ["kept"]
    fake.put_pool("missing", POOL, ns=NS)  # created later: followed from then on
    await eventually(lambda: names(ds) == ["a"], what="pool created")

    caplog.clear()
    fake.crd_installed = False
    await discover(kubeconfig, pool_name="pool-b")
    await eventually(lambda: "not found (404)" in caplog.text)
    assert "InferencePool CRD (inference.networking.k8s.io/v1) installed" in caplog.text


async def test_pool_without_selector_is_refused_and_the_pool_kept(
    fake, kubeconfig, discover, caplog
) -> None:
    caplog.set_level(logging.INFO, logger="epp.datalayer")
    fake.put_pool("pool-a", POOL, ns=NS)
    fake.put_pod("a", "10.0.0.1", ROLE, ns=NS)
    _, ds = await discover(kubeconfig, pool_name="pool-a")
    await eventually(lambda: names(ds) == ["a"])
    fake.put_pool("pool-a", {"targetPorts": [{"number": 8000}]}, ns=NS)
    await eventually(lambda: "has no spec.selector.matchLabels" in caplog.text)
    assert "InferencePool llm/pool-a has no spec.selector.matchLabels" in caplog.text
    assert names(ds) == ["a"]
    fake.delete_pool("pool-a", ns=NS)
    await eventually(lambda: "InferencePool llm/pool-a not found" in caplog.text)
    assert names(ds) == ["a"]


async def test_endpoint_selector_needs_no_crd(fake, kubeconfig, discover) -> None:
    fake.crd_installed = False
    fake.put_pod("a", "10.0.0.1", {"app": "vllm"}, ns=NS)
    fake.put_pod("b", "10.0.0.2", {"app": "other"}, ns=NS)
    spec = PoolSpec(selector=(("app", "vllm"),), ports=(8000, 9000))
    _, ds = await discover(kubeconfig, selector=spec)
    await eventually(lambda: names(ds) == ["a-8000", "a-9000"])
    assert fake.count("inferencepools") == 0


async def test_paged_list_reads_every_page(fake, kubeconfig, discover) -> None:
    fake.put_pool("pool-a", POOL, ns=NS)
    for i in range(7):
        fake.put_pod(f"p{i}", f"10.0.0.{i + 1}", ROLE, ns=NS)
    ds = Datastore(require_metrics=False)
    src = KubeSource(namespace=NS, pool_name="pool-a", timing=WatchTiming(page_size=3))
    d = KubernetesDiscovery(src, ds, load_api_client(kubeconfig))
    await d.start()
    try:
        await eventually(lambda: len(ds) == 7)
        assert fake.count("continue=") == 2  # 7 pods in pages of 3: 3 + 3 + 1
    finally:
        await d.stop()


# ---- `epp serve` end to end -------------------------------------------------------


async def test_epp_serve_follows_the_pool_from_the_flags(fake, kubeconfig) -> None:
    fake.put_pool("pool-a", POOL, ns=NS)
    fake.put_pod("a", "127.0.0.1", ROLE, ns=NS)
    argv = [sys.executable, "-m", "epp.cli", "serve", "--host", "127.0.0.1"]
    argv += ["--grpc-port", "0", "--health-port", "0", "--metrics-port", "0"]
    argv += ["--pool-name", "pool-a", "--pool-namespace", NS, "--kubeconfig", kubeconfig]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        assert "with InferencePool llm/pool-a" in line, line
        port = int(line.split("metrics ")[1].split(")")[0])
        url = f"http://127.0.0.1:{port}/debug/endpoints"
        seen: list[str] = []
        async with aiohttp.ClientSession() as http:

            async def poll(expected: list[str], what: str) -> None:
                async def fetch() -> None:
                    async with http.get(url) as r:
                        seen[:] = sorted(row["name"] for row in json.loads(await r.text()))

                loop = asyncio.get_running_loop()
                deadline = loop.time() + 10
                while True:
                    await fetch()
                    if seen == expected:
                        return
                    assert loop.time() < deadline, f"{what}: {seen} != {expected}"
                    await asyncio.sleep(0.02)

            await poll(["a"], "initial pool")
            fake.put_pod("b", "127.0.0.2", ROLE, ns=NS)
            await poll(["a", "b"], "b joins")
            fake.delete_pod("a", ns=NS)
            await poll(["b"], "a leaves")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    assert "Traceback" not in err.decode()


def test_bad_kubeconfig_is_one_clear_line(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "epp.cli", "serve", "--pool-name", "p"]
    argv += ["--kubeconfig", str(tmp_path / "missing")]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.startswith("epp serve: --kubeconfig: cannot load") and "missing" in r.stderr
    assert "Traceback" not in r.stderr


def test_no_credentials_at_all_is_one_clear_line(tmp_path: Path) -> None:
    env = {
        k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")
    }
    env["HOME"] = str(tmp_path)  # no ~/.kube/config
    argv = [sys.executable, "-m", "epp.cli", "serve", "--pool-name", "p"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 2
    assert r.stderr.startswith("epp serve: no cluster credentials") and "--kubeconfig" in r.stderr
    assert "Traceback" not in r.stderr
