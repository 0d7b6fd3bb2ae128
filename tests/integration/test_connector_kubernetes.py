"""The Kubernetes connector against a FAKE API server (tests/fake_kube.py
`FakeScaleAPI`): no real API server can run on this machine, so the fake checks the
exact requests the official client sends (paths, merge-patch content type, body)."""

from __future__ import annotations

from kubernetes import client

from epp.planner.core.types import Replicas, Role
from epp.planner.live.connectors.kubernetes import KubernetesConnector, Workload
from tests.fake_kube import FakeScaleAPI

P, D = Role.PREFILL, Role.DECODE
DEP = "/apis/apps/v1/namespaces/llm/deployments/vllm-decode"
LWS = "/apis/leaderworkerset.x-k8s.io/v1/namespaces/llm/leaderworkersets/vllm-prefill"


async def setup(now):
    fake = FakeScaleAPI()
    await fake.start()
    fake.put("deployments", "vllm-decode", replicas=2, ready=2, ns="llm")
    fake.put("leaderworkersets", "vllm-prefill", replicas=1, ready=1, ns="llm")
    cfg = client.Configuration()
    cfg.host = fake.url
    api = client.ApiClient(cfg)
    conn = KubernetesConnector(
        api, "llm",
        {D: Workload.parse("Deployment/vllm-decode"),
         P: Workload.parse("LeaderWorkerSet/vllm-prefill")},
        rollout_timeout_s=600, clock=lambda: now[0],
    )  # fmt: skip
    await conn.start()
    return fake, api, conn


async def test_scales_through_the_scale_subresource_and_waits_for_the_rollout():
    now = [0.0]
    fake, api, conn = await setup(now)
    try:
        assert conn.replicas() == {D: Replicas(ready=2), P: Replicas(ready=1)}
        fake.requests.clear()
        await conn.set_replicas(D, 3)
        assert fake.requests == [
            f"GET {DEP}/status",
            f'PATCH {DEP}/scale application/merge-patch+json {{"spec": {{"replicas": 3}}}}',
        ]
        await conn.refresh()
        assert conn.replicas()[D] == Replicas(ready=2, starting=1)  # spec 3, ready 2

        # still rolling out: the next decision waits (no PATCH) ...
        fake.requests.clear()
        now[0] = 100.0
        await conn.set_replicas(D, 4)
        assert not any(r.startswith("PATCH") for r in fake.requests)
        # ... unless the rollout timeout (600 s) has passed
        now[0] = 600.0
        await conn.set_replicas(D, 4)
        assert fake.requests[-1].startswith(f"PATCH {DEP}/scale")

        # once ready, a new target goes out at once; an unchanged one sends nothing
        fake.set_ready("deployments", "vllm-decode", 4, ns="llm")
        fake.requests.clear()
        await conn.set_replicas(D, 4)
        assert fake.requests == [f"GET {DEP}/status"]
        await conn.set_replicas(P, 2)
        assert fake.requests[-1] == (
            f'PATCH {LWS}/scale application/merge-patch+json {{"spec": {{"replicas": 2}}}}'
        )
    finally:
        api.close()
        await fake.stop()


def test_workload_names_are_checked():
    import pytest

    assert Workload.parse("StatefulSet/s") == Workload("StatefulSet", "s")
    with pytest.raises(ValueError, match="Kind/name"):
        Workload.parse("Pod/x")


def test_rbac_grants_exactly_what_the_connector_calls():
    """deploy/kubernetes/planner/rbac.yaml: get on status, get+patch on scale, for each
    kind the connector knows."""
    from pathlib import Path

    import yaml

    from epp.planner.live.connectors.kubernetes import KINDS

    path = Path(__file__).resolve().parents[2] / "deploy/kubernetes/planner/rbac.yaml"
    role = next(d for d in yaml.safe_load_all(path.read_text()) if d["kind"] == "Role")
    granted = {
        (g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
        for r in rule["resources"] for v in rule["verbs"]
    }  # fmt: skip
    for group, _, plural in KINDS.values():
        assert (group, f"{plural}/status", "get") in granted
        assert (group, f"{plural}/scale", "get") in granted
        assert (group, f"{plural}/scale", "patch") in granted
