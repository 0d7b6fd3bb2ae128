"""Kubernetes connector: each role is one workload (Deployment, StatefulSet or
LeaderWorkerSet, by convention labelled `llm-d.ai/role`), scaled through its scale
subresource with the official client (`CustomObjectsApi`, which addresses any
group/version/plural, so the three kinds take one code path).

- `set_replicas(role, n)`: PATCH `.../{name}/scale` `{"spec": {"replicas": n}}` when the
  count differs. Never a new decision while the last one is still rolling out (ready
  replicas below the spec, as Dynamo's connector waits for the graph to be Ready,
  reference §6.2), unless `rollout_timeout_s` has passed since it was issued.
- `replicas()`: ready = `status.readyReplicas`; starting = spec − ready; draining =
  pods still present above the spec (`status.replicas` − spec), refreshed on each call
  to `refresh()` (every tick of the caller's choosing) and before each scale.
- Drain is Kubernetes': pods get SIGTERM and their terminationGracePeriodSeconds (the
  model server drains itself); the EPP drops them when their endpoints go NotReady.

The `ApiClient` is given to `__init__` (tests point it at a loopback fake API server).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from kubernetes import client

from epp.planner.core.types import Replicas, Role

log = logging.getLogger("epp.planner.kubernetes")

KINDS = {
    "Deployment": ("apps", "v1", "deployments"),
    "StatefulSet": ("apps", "v1", "statefulsets"),
    "LeaderWorkerSet": ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets"),
}


@dataclass(frozen=True, slots=True)
class Workload:
    kind: str
    name: str

    @classmethod
    def parse(cls, text: str) -> Workload:
        """`Kind/name`, e.g. `Deployment/vllm-decode`."""
        kind, _, name = text.partition("/")
        if kind not in KINDS or not name:
            raise ValueError(f"{text!r}: expected Kind/name with Kind one of {', '.join(KINDS)}")
        return cls(kind, name)


class KubernetesConnector:
    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        workloads: Mapping[Role, Workload],
        *,
        rollout_timeout_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.objects = client.CustomObjectsApi(api)
        self.namespace = namespace
        self.workloads = dict(workloads)
        self.rollout_timeout_s = rollout_timeout_s
        self.clock = clock
        self._seen: dict[Role, Replicas] = {r: Replicas() for r in self.workloads}
        self._issued_at: dict[Role, float] = {}

    def _path(self, role: Role) -> dict[str, str]:
        w = self.workloads[role]
        group, version, plural = KINDS[w.kind]
        return dict(group=group, version=version, namespace=self.namespace, plural=plural,
                    name=w.name)  # fmt: skip

    # ---- Connector ---------------------------------------------------------
    async def start(self) -> None:
        await self.refresh()

    async def stop(self) -> None:
        """The workloads outlive the EPP: nothing to stop."""

    def replicas(self) -> Mapping[Role, Replicas]:
        return dict(self._seen)

    def ready_names(self) -> frozenset[str]:
        return frozenset()

    async def refresh(self) -> None:
        for role in self.workloads:
            self._seen[role] = await asyncio.to_thread(self._read, role)

    def _read(self, role: Role) -> Replicas:
        obj = self.objects.get_namespaced_custom_object_status(**self._path(role))
        spec = int((obj.get("spec") or {}).get("replicas") or 0)
        status = obj.get("status") or {}
        ready = int(status.get("readyReplicas") or 0)
        present = int(status.get("replicas") or 0)
        return Replicas(
            ready=min(ready, spec),
            starting=max(0, spec - ready),
            draining=max(0, present - spec),
        )

    async def set_replicas(self, role: Role, n: int, prefer_drain: Sequence[str] = ()) -> None:
        have = await asyncio.to_thread(self._read, role)
        self._seen[role] = have
        if have.active == n:
            return
        issued = self._issued_at.get(role)
        rolling = have.starting > 0 or have.draining > 0
        if rolling and issued is not None and self.clock() - issued < self.rollout_timeout_s:
            log.info("planner: %s still rolling out; %s → %d waits", role, role, n)
            return
        body = {"spec": {"replicas": n}}
        await asyncio.to_thread(
            self.objects.patch_namespaced_custom_object_scale, body=body, **self._path(role)
        )
        self._issued_at[role] = self.clock()
        log.info("planner: scaled %s %s to %d", self.workloads[role].kind, role, n)

    async def drain(self, name: str) -> None:
        log.info("planner: Kubernetes chooses which pod to remove (asked for %s)", name)
