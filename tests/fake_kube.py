"""A FAKE Kubernetes API server (aiohttp on loopback) for the discovery tests.

No real API server can run on the test machine, so this serves the resources the EPP
watches, pods (`/api/v1/namespaces/NS/pods`) and GIE InferencePools
(`/apis/inference.networking.k8s.io/v1/namespaces/NS/inferencepools`), InferenceObjectives
and InferenceModelRewrites in `llm-d.ai/v1alpha2` and `inference.networking.x-k8s.io/
v1alpha2` (`put_custom`; `missing` makes one answer 404 as an uninstalled CRD does), the
way the real one does, as far as a list/watch client can tell:

- every write bumps one global `resourceVersion`; lists return it in
  `metadata.resourceVersion`, each object carries its own;
- `labelSelector` (equality terms) and `fieldSelector=metadata.name=X` filter lists and
  watches; `limit` + `continue` page a list (a continue token older than the compaction
  point gets 410 Gone, as etcd compaction makes it);
- `watch=true&resourceVersion=RV` answers 200 with a chunked stream of JSON lines
  `{"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, "object": ...}`: first the history after
  RV, then live events; an object that stops matching the selector arrives as DELETED,
  one that starts matching as ADDED; `allowWatchBookmarks=true` gets BOOKMARK events
  (`send_bookmarks()`, or every `bookmark_interval` seconds); `timeoutSeconds` ends it;
- a watch from a resourceVersion older than `compact()` left gets a 200 whose only
  event is `ERROR` with a `Status` of code 410 ("too old resource version"), which is
  what the real server sends, so the client has to relist;
- `forbid(resource)` answers 403 with the real `Status` body (reason Forbidden); a
  resource set absent with `crd_installed=False` answers 404; `forbid(r, verbs=("watch",))`
  refuses only the watch, as a Role granting list but not watch does.
- Leases (`/apis/coordination.k8s.io/v1/namespaces/NS/leases[/NAME]`, added for leader
  election): GET one (404 NotFound when absent), POST create (409 AlreadyExists when
  present), PUT replace with optimistic concurrency (409 Conflict when the body's
  `metadata.resourceVersion` is not the stored one, as the real server does), each
  refusable with `forbid("leases", verbs=("get", "create", "update"))`.

Test controls mutate state from the test's event loop; `requests` records what the
client asked (method path?query), so a test can see that a relist happened.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

POOL_GROUP = "inference.networking.k8s.io"
PODS = "pods"
POOLS = "inferencepools"
LEASES = "leases"
LEASE_GROUP = "coordination.k8s.io"
# InferenceObjective / InferenceModelRewrite in llm-d-router's group and GIE's old one:
# resource key → (group, version, plural, kind).
OBJECTIVES = "inferenceobjectives.llm-d.ai"
REWRITES = "inferencemodelrewrites.llm-d.ai"
LEGACY_OBJECTIVES = "inferenceobjectives.inference.networking.x-k8s.io"
LEGACY_REWRITES = "inferencemodelrewrites.inference.networking.x-k8s.io"
CUSTOM = {
    POOLS: (POOL_GROUP, "v1", POOLS, "InferencePool"),
    OBJECTIVES: ("llm-d.ai", "v1alpha2", "inferenceobjectives", "InferenceObjective"),
    REWRITES: ("llm-d.ai", "v1alpha2", "inferencemodelrewrites", "InferenceModelRewrite"),
    LEGACY_OBJECTIVES: (
        "inference.networking.x-k8s.io", "v1alpha2", "inferenceobjectives", "InferenceObjective"
    ),
    LEGACY_REWRITES: (
        "inference.networking.x-k8s.io", "v1alpha2", "inferencemodelrewrites",
        "InferenceModelRewrite",
    ),
}  # fmt: skip


@dataclass
class _Event:
    rv: int
    resource: str
    namespace: str
    type: str  # ADDED | MODIFIED | DELETED
    obj: dict
    old: dict | None


@dataclass
class _Watcher:
    resource: str
    namespace: str
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)


def _matches(obj: dict | None, labels: dict[str, str], name: str | None) -> bool:
    if obj is None:
        return False
    meta = obj["metadata"]
    if name is not None and meta["name"] != name:
        return False
    have = meta.get("labels") or {}
    return all(have.get(k) == v for k, v in labels.items())


def _parse_selectors(q: Any) -> tuple[dict[str, str], str | None]:
    labels: dict[str, str] = {}
    for term in filter(None, q.get("labelSelector", "").split(",")):
        key, _, value = term.partition("=")
        labels[key] = value.lstrip("=")
    name = None
    fs = q.get("fieldSelector", "")
    if fs:
        key, _, value = fs.partition("=")
        assert key == "metadata.name", f"fake API server only knows metadata.name, got {fs}"
        name = value.lstrip("=")
    return labels, name


def _status(code: int, reason: str, message: str) -> dict:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class FakeKubeAPI:
    """Start with `await fake.start()`; `fake.url` is the server; `await fake.stop()`."""

    def __init__(self, bookmark_interval: float = 0.0) -> None:
        self.rv = 100
        self.compacted = 0  # watches/continues from an rv below this get 410
        self.objects: dict[tuple[str, str, str], dict] = {}
        self.history: list[_Event] = []
        self.watchers: list[_Watcher] = []
        self.forbidden: dict[str, set[str]] = {}  # resource -> refused verbs
        self.crd_installed = True
        self.missing: set[str] = set()  # custom resources whose CRD is not installed (404)
        self.bookmark_interval = bookmark_interval
        self.requests: list[str] = []
        self.bookmarks_sent = 0
        self.gone_sent = 0  # watches answered with 410 "too old resource version"
        self._runner: web.AppRunner | None = None
        self.url = ""

    # ---- server ---------------------------------------------------------------
    async def start(self, port: int = 0) -> None:
        """Serve on `port` (0: any free one; give the old port to "restart" the server)."""
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/{ns}/pods", self._handle(PODS))
        for key, (group, version, plural, _) in CUSTOM.items():
            app.router.add_get(
                f"/apis/{group}/{version}/namespaces/{{ns}}/{plural}", self._handle(key)
            )
        leases = f"/apis/{LEASE_GROUP}/v1/namespaces/{{ns}}/leases"
        app.router.add_get(leases + "/{name}", self._lease)
        app.router.add_put(leases + "/{name}", self._lease)
        app.router.add_post(leases, self._lease)
        self._runner = web.AppRunner(
            app, access_log=None, handler_cancellation=True, shutdown_timeout=0.1
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port, reuse_address=True)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        self.drop_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def kubeconfig(self, path: Any, namespace: str = "default") -> str:
        """Write a kubeconfig that points at this server (plain HTTP, no auth)."""
        text = f"""apiVersion: v1
kind: Config
clusters: [{{name: fake, cluster: {{server: "{self.url}"}}}}]
users: [{{name: fake, user: {{}}}}]
contexts: [{{name: fake, context: {{cluster: fake, user: fake, namespace: {namespace}}}}}]
current-context: fake
"""
        path.write_text(text)
        return str(path)

    def _handle(self, resource: str):
        async def handler(request: web.Request) -> web.StreamResponse:
            q = request.query
            self.requests.append(f"GET {request.path}?{request.query_string}")
            ns = request.match_info["ns"]
            verb = "watch" if q.get("watch") == "true" else "list"
            if verb in self.forbidden.get(resource, ()):
                group = CUSTOM[resource][0] if resource in CUSTOM else ""
                msg = (
                    f'{resource} is forbidden: User "system:serviceaccount:{ns}:epp" cannot'
                    f' {verb} resource "{resource}" in API group "{group}" in the namespace'
                    f' "{ns}"'
                )
                return web.json_response(_status(403, "Forbidden", msg), status=403)
            if (resource == POOLS and not self.crd_installed) or resource in self.missing:
                msg = "the server could not find the requested resource"
                return web.json_response(_status(404, "NotFound", msg), status=404)
            if q.get("watch") == "true":
                return await self._watch(request, resource, ns)
            return self._list(resource, ns, q)

        return handler

    def _list(self, resource: str, ns: str, q: Any) -> web.Response:
        labels, name = _parse_selectors(q)
        if "continue" in q:
            token = json.loads(base64.b64decode(q["continue"]))
            rv, start = token["rv"], token["start"]
            if rv < self.compacted:
                msg = "The provided continue parameter is too old to display a consistent list"
                return web.json_response(_status(410, "Expired", msg), status=410)
            items = token["items"]
        else:
            rv, start = self.rv, 0
            items = [
                copy.deepcopy(o)
                for (r, n, _), o in sorted(self.objects.items())
                if r == resource and n == ns and _matches(o, labels, name)
            ]
        limit = int(q.get("limit", "0") or 0)
        page = items[start : start + limit] if limit else items[start:]
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if limit and start + limit < len(items):
            token = {"rv": rv, "start": start + limit, "items": items}
            meta["continue"] = base64.b64encode(json.dumps(token).encode()).decode()
        kind = "PodList" if resource == PODS else CUSTOM[resource][3] + "List"
        api = "v1" if resource == PODS else "/".join(CUSTOM[resource][:2])
        body = {"kind": kind, "apiVersion": api, "metadata": meta, "items": page}
        return web.json_response(body)

    async def _watch(self, request: web.Request, resource: str, ns: str) -> web.StreamResponse:
        q = request.query
        labels, name = _parse_selectors(q)
        bookmarks = q.get("allowWatchBookmarks") == "true"
        timeout = float(q.get("timeoutSeconds", "0") or 0) or None
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)

        async def send(event_type: str, obj: dict) -> None:
            await resp.write(json.dumps({"type": event_type, "object": obj}).encode() + b"\n")

        since = int(q.get("resourceVersion") or 0)
        if since and since < self.compacted:
            msg = f"too old resource version: {since} ({self.compacted})"
            await send("ERROR", _status(410, "Expired", msg))
            self.gone_sent += 1
            return resp
        watcher = _Watcher(resource, ns)
        self.watchers.append(watcher)
        try:
            if not since:  # "any": synthetic ADDED for what exists now
                for (r, n, _), o in sorted(self.objects.items()):
                    if r == resource and n == ns and _matches(o, labels, name):
                        await send("ADDED", o)
            else:
                for ev in self.history:
                    if ev.rv > since:
                        await self._send_event(send, ev, resource, ns, labels, name)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout if timeout else None
            while True:
                wait = None if deadline is None else max(0.0, deadline - loop.time())
                if self.bookmark_interval and bookmarks:
                    every = self.bookmark_interval
                    wait = every if wait is None else min(wait, every)
                try:
                    item = await asyncio.wait_for(watcher.queue.get(), wait)
                except TimeoutError:
                    if deadline is not None and loop.time() >= deadline:
                        break
                    item = "bookmark"
                if item is None:  # dropped by the test: the connection just ends
                    break
                if item == "bookmark":
                    if bookmarks:
                        kind = "Pod" if resource == PODS else CUSTOM[resource][3]
                        meta = {"resourceVersion": str(self.rv)}
                        await send("BOOKMARK", {"kind": kind, "metadata": meta})
                        self.bookmarks_sent += 1
                    continue
                await self._send_event(send, item, resource, ns, labels, name)
        except ConnectionResetError:
            pass
        finally:
            self.watchers.remove(watcher)
        return resp

    @staticmethod
    async def _send_event(send, ev: _Event, resource, ns, labels, name) -> None:
        if ev.resource != resource or ev.namespace != ns:
            return
        now = _matches(ev.obj, labels, name)
        before = _matches(ev.old, labels, name)
        if ev.type == "DELETED":
            if before:
                await send("DELETED", ev.obj)
        elif now and before:
            await send("MODIFIED", ev.obj)
        elif now:
            await send("ADDED", ev.obj)
        elif before:  # stopped matching the selector: the watcher sees it go
            await send("DELETED", ev.obj)

    async def _lease(self, request: web.Request) -> web.Response:
        """GET / POST / PUT one Lease, as the real server answers them."""
        ns = request.match_info["ns"]
        verb = {"GET": "get", "POST": "create", "PUT": "update"}[request.method]
        body = await request.json() if request.method != "GET" else {}
        name = request.match_info.get("name") or body.get("metadata", {}).get("name", "")
        self.requests.append(f"{request.method} {request.path}")
        if verb in self.forbidden.get(LEASES, ()):
            msg = (
                f'leases.{LEASE_GROUP} "{name}" is forbidden: User '
                f'"system:serviceaccount:{ns}:epp" cannot {verb} resource "leases" in API '
                f'group "{LEASE_GROUP}" in the namespace "{ns}"'
            )
            return web.json_response(_status(403, "Forbidden", msg), status=403)
        stored = self.objects.get((LEASES, ns, name))
        if (verb == "get" and stored is None) or (verb == "update" and stored is None):
            msg = f'leases.{LEASE_GROUP} "{name}" not found'
            return web.json_response(_status(404, "NotFound", msg), status=404)
        if verb == "get":
            return web.json_response(stored)
        if verb == "create" and stored is not None:
            msg = f'leases.{LEASE_GROUP} "{name}" already exists'
            return web.json_response(_status(409, "AlreadyExists", msg), status=409)
        if verb == "update":
            assert stored is not None
            sent = body.get("metadata", {}).get("resourceVersion")
            if sent != stored["metadata"]["resourceVersion"]:
                msg = (
                    f'Operation cannot be fulfilled on leases.{LEASE_GROUP} "{name}": the '
                    "object has been modified; please apply your changes to the latest "
                    "version and try again"
                )
                return web.json_response(_status(409, "Conflict", msg), status=409)
        body.setdefault("metadata", {})
        self._write(LEASES, ns, body, name)
        return web.json_response(
            self.objects[(LEASES, ns, name)], status=201 if verb == "create" else 200
        )

    def lease(self, name: str, ns: str = "default") -> dict | None:
        """The stored Lease (a test reads its holder), or None."""
        return self.objects.get((LEASES, ns, name))

    # ---- test controls --------------------------------------------------------
    def _write(self, resource: str, ns: str, obj: dict | None, name: str) -> None:
        key = (resource, ns, name)
        old = self.objects.get(key)
        self.rv += 1
        if obj is None:
            if old is None:
                return
            del self.objects[key]
            gone = copy.deepcopy(old)
            gone["metadata"]["resourceVersion"] = str(self.rv)
            ev = _Event(self.rv, resource, ns, "DELETED", gone, old)
        else:
            obj = copy.deepcopy(obj)
            obj["metadata"].update(name=name, namespace=ns, resourceVersion=str(self.rv))
            self.objects[key] = obj
            ev = _Event(self.rv, resource, ns, "MODIFIED" if old else "ADDED", obj, old)
        self.history.append(ev)
        for w in self.watchers:
            w.queue.put_nowait(ev)

    def put_pod(
        self,
        name: str,
        ip: str,
        labels: dict[str, str] | None = None,
        ready: bool = True,
        ns: str = "default",
        terminating: bool = False,
    ) -> None:
        meta: dict[str, Any] = {"name": name, "labels": dict(labels or {})}
        if terminating:
            meta["deletionTimestamp"] = "2026-11-23T00:00:00Z"
        pod = {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": meta,
            "spec": {"containers": [{"name": "vllm", "image": "vllm"}]},
            "status": {
                "phase": "Running",
                "podIP": ip,
                "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            },
        }
        self._write(PODS, ns, pod, name)

    def delete_pod(self, name: str, ns: str = "default") -> None:
        self._write(PODS, ns, None, name)

    def put_pool(self, name: str, spec: dict, ns: str = "default") -> None:
        pool = {
            "kind": "InferencePool",
            "apiVersion": f"{POOL_GROUP}/v1",
            "metadata": {"name": name},
            "spec": spec,
        }
        self._write(POOLS, ns, pool, name)

    def delete_pool(self, name: str, ns: str = "default") -> None:
        self._write(POOLS, ns, None, name)

    def put_custom(self, resource: str, name: str, spec: dict, ns: str = "default") -> None:
        """An InferenceObjective / InferenceModelRewrite (`resource`: a CUSTOM key), with a
        creationTimestamp that orders objects by when they were first put."""
        group, version, _, kind = CUSTOM[resource]
        old = self.objects.get((resource, ns, name))
        created = (
            old["metadata"]["creationTimestamp"]
            if old
            else f"2026-11-27T00:{self.rv // 60 % 60:02d}:{self.rv % 60:02d}Z"
        )
        obj = {
            "kind": kind,
            "apiVersion": f"{group}/{version}",
            "metadata": {"name": name, "creationTimestamp": created},
            "spec": spec,
        }
        self._write(resource, ns, obj, name)

    def delete_custom(self, resource: str, name: str, ns: str = "default") -> None:
        self._write(resource, ns, None, name)

    def compact(self) -> None:
        """Forget history, as etcd compaction does: older resourceVersions get 410."""
        self.compacted = self.rv
        self.history.clear()

    def drop_watches(self) -> None:
        """End every open watch stream (as an API server restart or LB idle cut does)."""
        for w in list(self.watchers):
            w.queue.put_nowait(None)

    def send_bookmarks(self) -> None:
        for w in list(self.watchers):
            w.queue.put_nowait("bookmark")

    def forbid(
        self, resource: str, forbidden: bool = True, verbs: tuple[str, ...] = ("list", "watch")
    ) -> None:
        if forbidden:
            self.forbidden[resource] = set(verbs)
        else:
            self.forbidden.pop(resource, None)

    def watching(self, resource: str) -> int:
        """How many watch streams on `resource` are open now."""
        return sum(w.resource == resource for w in self.watchers)

    def count(self, fragment: str) -> int:
        return sum(fragment in r for r in self.requests)


class FakeScaleAPI:
    """A fake API server for the planner's Kubernetes connector: scalable workloads
    (`/apis/{group}/{version}/namespaces/{ns}/{plural}/{name}`) with `/scale` (GET,
    PATCH with a merge patch) and `/status` (GET). `requests` records every call as
    `METHOD path content-type body`; `set_ready` plays the controller."""

    def __init__(self) -> None:
        self.workloads: dict[tuple[str, str, str], dict] = {}
        self.requests: list[str] = []
        self._runner: web.AppRunner | None = None
        self.url = ""

    def put(self, plural: str, name: str, replicas: int, ready: int, ns: str = "default"):
        self.workloads[(ns, plural, name)] = {
            "replicas": replicas,
            "ready": ready,
            "present": replicas,
        }

    def set_ready(self, plural: str, name: str, ready: int, ns: str = "default") -> None:
        w = self.workloads[(ns, plural, name)]
        w["ready"] = ready
        w["present"] = max(ready, w["replicas"])

    async def start(self) -> None:
        app = web.Application()
        base = "/apis/{group}/{version}/namespaces/{ns}/{plural}/{name}"
        app.router.add_get(base + "/scale", self._scale)
        app.router.add_patch(base + "/scale", self._scale)
        app.router.add_get(base + "/status", self._status)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def _find(self, request: web.Request) -> tuple[dict, dict] | None:
        m = request.match_info
        w = self.workloads.get((m["ns"], m["plural"], m["name"]))
        if w is None:
            return None
        meta = {"name": m["name"], "namespace": m["ns"]}
        return w, meta

    async def _scale(self, request: web.Request) -> web.Response:
        body = await request.text()
        ctype = request.headers.get("Content-Type", "")
        self.requests.append(f"{request.method} {request.path} {ctype} {body}".strip())
        found = self._find(request)
        if found is None:
            return web.json_response(_status(404, "NotFound", "not found"), status=404)
        w, meta = found
        if request.method == "PATCH":
            if ctype != "application/merge-patch+json":
                return web.json_response(_status(415, "UnsupportedMediaType", ctype), status=415)
            w["replicas"] = int(json.loads(body)["spec"]["replicas"])
        return web.json_response({"apiVersion": "autoscaling/v1", "kind": "Scale",
                                  "metadata": meta, "spec": {"replicas": w["replicas"]},
                                  "status": {"replicas": w["present"]}})  # fmt: skip

    async def _status(self, request: web.Request) -> web.Response:
        self.requests.append(f"GET {request.path}")
        found = self._find(request)
        if found is None:
            return web.json_response(_status(404, "NotFound", "not found"), status=404)
        w, meta = found
        return web.json_response({"metadata": meta, "spec": {"replicas": w["replicas"]},
                                  "status": {"replicas": w["present"],
                                             "readyReplicas": w["ready"]}})  # fmt: skip
