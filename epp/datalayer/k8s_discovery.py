"""Kubernetes endpoint discovery: an InferencePool (or a plain label selector) → the datastore.

Two reflectors (`k8s_reflector`), each on its own thread:

- the `InferencePool` named by `--pool-name` (`inference.networking.k8s.io/v1`, listed with
  `fieldSelector=metadata.name=NAME`), whose `spec.selector.matchLabels` and
  `spec.targetPorts` say which pods and ports are the pool; a changed selector makes the
  pod reflector relist under it;
- the pods matching that selector (or `--endpoint-selector`, without the CRD).

Every pod sync is mapped by `k8s_pods.PodMapper` (the pure rules, memoised per pod) and
handed to the event loop (`call_soon_threadsafe`), where `Datastore.set_endpoints`
replaces the pool the same way the endpoints-file watcher does: endpoints that stay keep
their metrics and in-flight counters, ones that leave stop getting new requests while
their in-flight ones finish.

Nothing here can empty a live pool by mistake: a pool that does not exist, an
InferencePool without a selector, or a 403 from RBAC is logged once (ERROR, naming the
object and the fix) and the last known pool stays in force until the cause is fixed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from epp.datalayer.k8s_pods import PodMapper, PoolSpec, PoolSpecError, pool_spec
from epp.datalayer.k8s_reflector import Objects, Reflector, WatchTiming
from epp.datastore import Datastore, Endpoint

if TYPE_CHECKING:
    from kubernetes import client

__all__ = ["KubeConfigError", "KubeSource", "KubernetesDiscovery", "load_api_client"]

log = logging.getLogger(__name__)

POOL_GROUP = "inference.networking.k8s.io"
POOL_VERSION = "v1"
POOL_PLURAL = "inferencepools"


class KubeConfigError(ValueError):
    """No usable cluster credentials (in-cluster or kubeconfig)."""


@dataclass(frozen=True, slots=True)
class KubeSource:
    """Where the pool comes from: an InferencePool by name, or a fixed selector + ports."""

    namespace: str
    pool_name: str | None = None
    selector: PoolSpec | None = None  # --endpoint-selector mode
    kubeconfig: str | None = None
    timing: WatchTiming = field(default_factory=WatchTiming)

    def __post_init__(self) -> None:
        if (self.pool_name is None) == (self.selector is None):
            raise ValueError("KubeSource needs exactly one of pool_name and selector")

    def describe(self) -> str:
        if self.pool_name:
            return f"InferencePool {self.namespace}/{self.pool_name}"
        assert self.selector is not None
        ports = ",".join(map(str, self.selector.ports))
        return f"pods {self.selector.selector_text} in {self.namespace} (ports {ports})"


def load_api_client(kubeconfig: str | None) -> client.ApiClient:
    """`--kubeconfig`, else in-cluster (the pod's ServiceAccount), else $KUBECONFIG or
    ~/.kube/config (the client's own default). The `kubernetes` package is imported
    here, not at module level: it costs ~1.5 s of CPU, paid only when discovery is on."""
    from kubernetes import client, config

    cfg = client.Configuration()
    try:
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=cfg)
        else:
            config.load_kube_config(client_configuration=cfg)
    except (config.ConfigException, OSError, ValueError) as e:
        if kubeconfig:
            raise KubeConfigError(f"--kubeconfig: cannot load {kubeconfig}: {e}") from e
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            raise KubeConfigError(f"in-cluster config: {e}; is a ServiceAccount mounted?") from e
        raise KubeConfigError(
            f"no cluster credentials: not in a pod and no kubeconfig ({e});"
            " pass --kubeconfig FILE or set $KUBECONFIG"
        ) from e
    return client.ApiClient(cfg)


class _ErrorLog:
    """Logs an error when it appears or changes and once on recovery, not on every retry."""

    def __init__(self, datastore: Datastore) -> None:
        self._datastore = datastore
        self._last: dict[str, str | None] = {}

    def report(self, key: str, error: str | None) -> None:
        last = self._last.get(key)
        self._last[key] = error
        if error == last:
            return
        if error:
            log.error(
                "kubernetes discovery: %s; keeping the last known pool (%d endpoints)",
                error,
                len(self._datastore),
            )
        elif last:
            log.info("kubernetes discovery: %s recovered", key)


class KubernetesDiscovery:
    """`await start()` inside the serving loop; `await stop()` joins the threads."""

    def __init__(
        self, source: KubeSource, datastore: Datastore, api: client.ApiClient | None = None
    ) -> None:
        from kubernetes import client

        self.source = source
        self.datastore = datastore
        self.api = api or load_api_client(source.kubeconfig)
        self._errors = _ErrorLog(datastore)
        self._lock = threading.Lock()
        self._spec: PoolSpec | None = source.selector
        self._pods_objs: Objects = {}
        self._mapper = PodMapper()
        self._loop: asyncio.AbstractEventLoop | None = None
        ns = source.namespace
        self.pods = Reflector(
            f"pods in namespace {ns}",
            client.CoreV1Api(self.api).list_namespaced_pod,
            (ns,),
            self._pods_synced,
            lambda e: self._errors.report("pods", e),
            label_selector=source.selector.selector_text if source.selector else None,
            timing=source.timing,
        )
        self.pool: Reflector | None = None
        if source.pool_name:
            self.pool = Reflector(
                f"InferencePool {ns}/{source.pool_name}",
                client.CustomObjectsApi(self.api).list_namespaced_custom_object,
                (POOL_GROUP, POOL_VERSION, ns, POOL_PLURAL),
                self._pool_synced,
                lambda e: self._errors.report("pool-api", e),
                field_selector=f"metadata.name={source.pool_name}",
                timing=source.timing,
            )

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        log.info("kubernetes discovery: following %s", self.source.describe())
        if self.pool is not None:
            self.pool.start()  # the pod reflector starts once the pool's selector is known
        else:
            self.pods.start()

    async def stop(self) -> None:
        reflectors = [r for r in (self.pool, self.pods) if r is not None]
        await asyncio.gather(*(asyncio.to_thread(r.stop) for r in reflectors))
        self.api.close()

    # ---- reflector callbacks (their threads) ------------------------------------
    def _pool_synced(self, _selector: str | None, objects: Objects) -> None:
        name = self.source.pool_name
        where = f"InferencePool {self.source.namespace}/{name}"
        pool = objects.get(name or "")
        if pool is None:
            self._errors.report(
                "pool",
                f"{where} not found; check --pool-name/--pool-namespace"
                f" (kubectl get inferencepools -n {self.source.namespace})",
            )
            return
        try:
            spec = pool_spec(pool)
        except PoolSpecError as e:
            self._errors.report("pool", str(e))
            return
        self._errors.report("pool", None)
        with self._lock:
            old, self._spec = self._spec, spec
        if old is None or old.selector != spec.selector:
            log.info("kubernetes discovery: %s selects %s", where, spec.selector_text)
            self.pods.set_label_selector(spec.selector_text)
        elif old.ports != spec.ports:
            self._publish()

    def _pods_synced(self, selector: str | None, objects: Objects) -> None:
        with self._lock:
            if self._spec is None or selector != self._spec.selector_text:
                return  # listed under a selector that has since changed: a relist follows
            self._pods_objs = dict(objects)
        self._publish()

    def _publish(self) -> None:
        with self._lock:
            if self._spec is None:
                return
            endpoints = self._mapper.map(self._pods_objs, self._spec.ports)
        loop = self._loop
        if loop is not None and not loop.is_closed():
            # RuntimeError: the loop closed between the check and the call.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._apply, endpoints)

    def _apply(self, endpoints: list[Endpoint]) -> None:
        """On the event loop: replace the pool if it changed."""
        before = {e.name for e in self.datastore.endpoints()}
        if endpoints == sorted(self.datastore.endpoints(), key=lambda e: e.name):
            return
        after = {e.name for e in endpoints}
        self.datastore.set_endpoints(endpoints)
        log.info(
            "kubernetes discovery: %d endpoints (joined: %s; left: %s)",
            len(endpoints),
            ", ".join(sorted(after - before)) or "-",
            ", ".join(sorted(before - after)) or "-",
        )
