"""The pool's InferenceObjectives and InferenceModelRewrites from Kubernetes.

Where upstream keeps them now: llm-d-router's `llm-d.ai/v1alpha2` (`apix/v1alpha2`), and
their old home, GIE's `inference.networking.x-k8s.io/v1alpha2`, which llm-d-router still
reads with a deprecation warning (`pkg/epp/server/controller_config.go`,
`pkg/epp/controller/inference{objective,modelrewrite}_reconciler.go`). One reflector per
resource and group (`k8s_reflector`, the official `kubernetes` client, as the pool is
watched), in the pool's namespace; an object counts when its `spec.poolRef` names this
pool (name, and group defaulting to `inference.networking.k8s.io`), as upstream's event
predicate decides.

Upstream prefers the `llm-d.ai` group and ignores every legacy object once both CRDs are
installed; here both are read and, for a name both groups use, the `llm-d.ai` object
wins: a cluster half-way through the migration keeps the objectives and rewrites it has
not moved yet. A CRD that is not installed (404) is noted once at INFO and retried slowly;
a forbidden one (403) is an ERROR naming the RBAC fix, and the last known objects stay in
force. Each change is handed to the event loop whole: the objectives (name → priority)
over those of `--objectives`, the rewrites with those of `--model-rewrites`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from epp.admission import Objectives
from epp.config.errors import ConfigError
from epp.datalayer.k8s_reflector import Objects, Reflector, WatchTiming
from epp.rewrite import POOL_GROUP, Rewrite, parse_rewrite

if TYPE_CHECKING:
    from kubernetes import client

log = logging.getLogger(__name__)

GROUP = "llm-d.ai"
LEGACY_GROUP = "inference.networking.x-k8s.io"
VERSION = "v1alpha2"
OBJECTIVES = "inferenceobjectives"
REWRITES = "inferencemodelrewrites"


@dataclass(frozen=True)
class _Source:
    plural: str
    group: str

    @property
    def legacy(self) -> bool:
        return self.group == LEGACY_GROUP

    def describe(self, ns: str) -> str:
        return f"{self.plural}.{self.group}/{VERSION} in {ns}"


SOURCES = tuple(_Source(p, g) for p in (OBJECTIVES, REWRITES) for g in (GROUP, LEGACY_GROUP))


def refers_to_pool(obj: dict[str, Any], pool: str, pool_group: str = POOL_GROUP) -> bool:
    ref = (obj.get("spec") or {}).get("poolRef") or {}
    return ref.get("name") == pool and (ref.get("group") or POOL_GROUP) == pool_group


def objective_priorities(objects: dict[_Source, Objects], pool: str) -> dict[str, int]:
    """name → spec.priority (unset: 0, upstream's reading) of this pool's objectives; the
    `llm-d.ai` object wins a name both groups use."""
    out: dict[str, int] = {}
    for src in sorted(objects, key=lambda s: not s.legacy):  # legacy first, then overwritten
        if src.plural != OBJECTIVES:
            continue
        for name, obj in objects[src].items():
            if not refers_to_pool(obj, pool):
                continue
            prio = (obj.get("spec") or {}).get("priority", 0)
            if isinstance(prio, int) and not isinstance(prio, bool):
                out[name] = prio
            else:
                log.error("InferenceObjective %s: spec.priority %r is not an integer", name, prio)
    return out


def pool_rewrites(objects: dict[_Source, Objects], pool: str) -> list[Rewrite]:
    """This pool's InferenceModelRewrites that check out (a broken one is logged, skipped)."""
    out: list[Rewrite] = []
    for src, objs in objects.items():
        if src.plural != REWRITES:
            continue
        for name, obj in objs.items():
            if not refers_to_pool(obj, pool):
                continue
            try:
                out.append(parse_rewrite(obj, f"InferenceModelRewrite {name}"))
            except ConfigError as e:
                log.error("ignoring %s: %s", src.describe(""), e)
    return out


class KubeObjectives:
    """`await start()` in the serving loop; `await stop()` joins the threads.
    `on_objectives(dict)` and `on_rewrites(list[Rewrite])` run on the loop."""

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        pool: str,
        on_objectives: Callable[[dict[str, int]], None],
        on_rewrites: Callable[[list[Rewrite]], None],
        timing: WatchTiming | None = None,
    ) -> None:
        from kubernetes import client

        self.namespace, self.pool = namespace, pool
        self._on_objectives, self._on_rewrites = on_objectives, on_rewrites
        self._lock = threading.Lock()
        self._objects: dict[_Source, Objects] = {}
        self._reported: dict[_Source, str | None] = {}
        self._warned_legacy: set[tuple[str, str]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        list_fn = client.CustomObjectsApi(api).list_namespaced_custom_object
        self.reflectors = [
            Reflector(
                src.describe(namespace),
                list_fn,
                (src.group, VERSION, namespace, src.plural),
                lambda _sel, objs, src=src: self._synced(src, objs),
                lambda err, src=src: self._error(src, err),
                timing=timing or WatchTiming(),
            )
            for src in SOURCES
        ]

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        for r in self.reflectors:
            r.start()

    async def stop(self) -> None:
        await asyncio.gather(*(asyncio.to_thread(r.stop) for r in self.reflectors))

    # ---- reflector threads -----------------------------------------------------------
    def _error(self, src: _Source, error: str | None) -> None:
        with self._lock:
            last = self._reported.get(src)
            self._reported[src] = error
        if error == last:
            return
        if error is None:
            if last is not None:
                log.info("kubernetes: %s readable again", src.describe(self.namespace))
        elif "(404)" in error:
            log.info(
                "kubernetes: %s is not installed (404); reading it when it is",
                src.describe(self.namespace),
            )
        else:
            log.error("kubernetes: %s; keeping the last known objects", error)

    def _synced(self, src: _Source, objects: Objects) -> None:
        with self._lock:
            self._objects[src] = dict(objects)
            snapshot = dict(self._objects)
        if src.legacy:
            for name, obj in objects.items():
                if refers_to_pool(obj, self.pool) and (src.plural, name) not in self._warned_legacy:
                    self._warned_legacy.add((src.plural, name))
                    log.warning(
                        "DEPRECATION: %s %s uses apiVersion %s/%s; move it to %s/%s "
                        "(llm-d-router's group)",
                        obj.get("kind", src.plural),
                        name,
                        LEGACY_GROUP,
                        VERSION,
                        GROUP,
                        VERSION,
                    )
        if src.plural == OBJECTIVES:
            priorities = objective_priorities(snapshot, self.pool)
            self._hand(self._on_objectives, priorities)
        else:
            self._hand(self._on_rewrites, pool_rewrites(snapshot, self.pool))

    def _hand(self, fn: Callable[[Any], None], value: Any) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(fn, value)


def merged_objectives(base: Objectives, cluster: dict[str, int]) -> Objectives:
    """`--objectives` with the cluster's objectives over it (same name: the cluster's)."""
    return Objectives({**base.priorities, **cluster})
