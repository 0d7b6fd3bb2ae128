"""InferenceObjectives and InferenceModelRewrites from Kubernetes, against the FAKE API server.

No real API server can run here; `tests/fake_kube.py` serves both resources in
llm-d-router's `llm-d.ai/v1alpha2` and GIE's `inference.networking.x-k8s.io/v1alpha2` the
way the real one does to a list/watch client. The EPP side is real: the official
`kubernetes` client in the reflector threads, and for the last test a whole in-process
`EppServer` discovering its pool, objectives and rewrites from the same server.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from epp.datalayer.k8s_discovery import KubeSource, load_api_client
from epp.datalayer.k8s_reflector import WatchTiming
from epp.datalayer.k8s_resources import KubeObjectives
from epp.rewrite import ModelRewrites, Rewrite
from epp.serve import EppServer, ServeOptions
from tests.fake_kube import LEGACY_OBJECTIVES, LEGACY_REWRITES, OBJECTIVES, REWRITES
from tests.integration import test_k8s_discovery as discovery

# The fake API server and its kubeconfig: the discovery tests' fixtures.
NS = discovery.NS
fake = discovery.fake
kubeconfig = discovery.kubeconfig

FAST = WatchTiming(backoff_initial=0.05, backoff_max=0.2)
REF = {"group": "inference.networking.k8s.io", "name": "pool-a"}


def objective(priority: int, pool: str = "pool-a") -> dict:
    return {"priority": priority, "poolRef": {**REF, "name": pool}}


def canary(v2_weight: int) -> dict:
    return {
        "poolRef": REF,
        "rules": [
            {
                "matches": [{"model": {"type": "Exact", "value": "llama"}}],
                "targets": [
                    {"modelRewrite": "llama-v1", "weight": 100 - v2_weight},
                    {"modelRewrite": "llama-v2", "weight": v2_weight},
                ],
            }
        ],
    }


async def eventually(pred: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        assert loop.time() < deadline, f"not within {timeout}s: {what}"
        await asyncio.sleep(0.01)


async def test_objectives_from_both_groups_the_llm_d_one_winning_a_shared_name(
    fake, kubeconfig, caplog
) -> None:
    fake.put_custom(OBJECTIVES, "critical", objective(100), ns=NS)
    fake.put_custom(LEGACY_OBJECTIVES, "critical", objective(5), ns=NS)
    fake.put_custom(LEGACY_OBJECTIVES, "batch", objective(-1), ns=NS)
    fake.put_custom(OBJECTIVES, "other-pool", objective(7, pool="pool-b"), ns=NS)
    fake.missing.add(LEGACY_REWRITES)  # that CRD is not installed: noted, not an error
    seen: dict[str, int] = {}
    rewrites: list[list[Rewrite]] = []
    api = load_api_client(kubeconfig)

    def objectives(priorities: dict[str, int]) -> None:
        seen.clear()
        seen.update(priorities)

    watch = KubeObjectives(api, NS, "pool-a", objectives, rewrites.append, timing=FAST)
    caplog.set_level(logging.INFO, "epp.datalayer.k8s_resources")
    await watch.start()
    try:
        await eventually(lambda: seen == {"critical": 100, "batch": -1}, f"objectives {seen}")
        fake.delete_custom(OBJECTIVES, "critical", ns=NS)
        await eventually(lambda: seen == {"critical": 5, "batch": -1}, "the legacy one shows")
        fake.put_custom(REWRITES, "canary", canary(10), ns=NS)
        await eventually(lambda: bool(rewrites and rewrites[-1]), "the rewrite")
        table = ModelRewrites.build(rewrites[-1])
        assert table.names == ("canary",) and table.target("llama", "r") in ("llama-v1", "llama-v2")
        fake.put_custom(REWRITES, "canary", canary(100 - 1), ns=NS)  # weights changed live
        await eventually(
            lambda: rewrites[-1][0].rules[0].targets[1].weight == 99, "the updated rewrite"
        )
    finally:
        await watch.stop()
        api.close()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert (
        "inferencemodelrewrites.inference.networking.x-k8s.io/v1alpha2 in llm is not installed"
        in messages
    )
    assert (
        "DEPRECATION: InferenceObjective batch uses apiVersion inference.networking.x-k8s.io"
        in messages
    )


async def test_forbidden_objectives_name_the_rbac_fix_and_keep_the_last_known(
    fake, kubeconfig, caplog
) -> None:
    fake.put_custom(OBJECTIVES, "critical", objective(100), ns=NS)
    seen: list[dict[str, int]] = []
    api = load_api_client(kubeconfig)
    watch = KubeObjectives(api, NS, "pool-a", seen.append, lambda _: None, timing=FAST)
    await watch.start()
    try:
        await eventually(lambda: bool(seen) and seen[-1] == {"critical": 100}, "objectives")
        fake.forbid(OBJECTIVES)
        fake.drop_watches()
        await eventually(
            lambda: any("forbidden (403)" in r.getMessage() for r in caplog.records), "403 logged"
        )
        assert seen[-1] == {"critical": 100}  # the last known objectives stay in force
    finally:
        await watch.stop()
        api.close()


async def test_epp_server_takes_pool_objectives_and_rewrites_from_the_cluster(
    fake, kubeconfig
) -> None:
    fake.put_pool(
        "pool-a",
        {"selector": {"matchLabels": {"app": "vllm"}}, "targetPorts": [{"number": 8000}]},
        ns=NS,
    )
    fake.put_pod("a", "127.0.0.1", {"app": "vllm"}, ns=NS)
    fake.put_custom(OBJECTIVES, "batch", objective(-1), ns=NS)
    fake.put_custom(REWRITES, "canary", canary(10), ns=NS)
    source = KubeSource(namespace=NS, pool_name="pool-a", kubeconfig=kubeconfig, timing=FAST)
    opts = ServeOptions(
        host="127.0.0.1", grpc_port=0, health_port=0, metrics_port=0, scrape=False,
        kubernetes=source, pool_name="pool-a",
    )  # fmt: skip
    async with EppServer(opts) as server:
        d = server.director
        await eventually(lambda: len(server.datastore) == 1, "the pool")
        await eventually(
            lambda: d.admission is not None and d.admission.objectives.priorities == {"batch": -1},
            "objectives",
        )
        await eventually(lambda: d.rewrites is not None, "rewrites")
        assert d.rewrites is not None and d.rewrites.names == ("canary",)
        fake.delete_custom(REWRITES, "canary", ns=NS)
        await eventually(lambda: d.rewrites is None, "the rewrite removed")
