"""List + watch one Kubernetes resource in a worker thread, the way client-go's reflector does.

The official `kubernetes` client is synchronous (urllib3), so each reflector owns one
daemon thread and the event loop never blocks on it. The loop:

1. **list** (paged, `limit` + `continue`) → the full set of objects and the list's
   `resourceVersion`; hand the set to `on_sync`;
2. **watch** from that resourceVersion (`allowWatchBookmarks=true`, server-side
   `timeoutSeconds`), applying ADDED/MODIFIED/DELETED to the set and handing it over after
   each event; BOOKMARK events only advance the resourceVersion (so a re-watch does not
   start from one the server has compacted away); a watch that ends is re-opened from the
   last resourceVersion;
3. **relist** every `relist_period` seconds (resync: a missed event cannot live longer),
   at once on **410 Gone** ("too old resource version", from a watch or an expired
   continue token), and when the selector changes;
4. any other error (403 RBAC, 404, connection refused, ...) is reported through
   `on_error` and retried with capped exponential backoff with jitter; the last synced
   set stays in force meanwhile.

Objects are the raw JSON dicts the server sent (`_raw_watch_class`): the callers read a handful
of fields and need no model classes. `stop()` shuts the watch socket down
of the open watch response, so a thread blocked in a read ends at once; the response is
registered under a lock as soon as it exists, so no stop or restart can slip in between
the request and the first read.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubernetes.client.exceptions import ApiException

__all__ = ["Reflector", "WatchTiming", "describe_api_error"]

log = logging.getLogger(__name__)

Objects = dict[str, dict[str, Any]]


def _api_exception() -> type[ApiException]:
    """The client's ApiException, imported when first needed: importing the `kubernetes`
    package costs ~1.5 s of CPU, which `epp serve` without discovery must not pay at start."""
    from kubernetes.client.exceptions import ApiException

    return ApiException


@functools.cache
def _raw_watch_class() -> type[Any]:
    """A Watch that yields events as plain dicts, ERROR events included (the class is
    made on first use, for the same reason as `_api_exception`).

    `Watch.stream(..., deserialize=False)` would do the first, but in kubernetes 37.0.2 it
    then fails with KeyError 'raw_object' on an ERROR event (the 410 Gone this reflector
    must see as an ApiException); with no return type the event is left as parsed JSON
    with `raw_object` set, and the 410 becomes ApiException(status=410).
    """
    from kubernetes import watch

    class RawWatch(watch.Watch):  # type: ignore[misc]
        def get_return_type(self, func: Callable[..., Any]) -> None:
            return None

    return RawWatch


@dataclass(frozen=True, slots=True)
class WatchTiming:
    """Timing of the list/watch loop; the defaults follow client-go's reflector.

    client-go re-opens a watch after a random 5..10 min server-side timeout
    (`minWatchTimeout`, tools/cache/reflector.go) and backs off 800 ms → 30 s; here the
    watch timeout is fixed and a full relist happens every `relist_period` as resync.
    """

    watch_timeout: int = 300  # seconds, sent as timeoutSeconds
    relist_period: float = 600.0
    backoff_initial: float = 0.5
    backoff_max: float = 30.0
    connect_timeout: float = 5.0
    page_size: int = 500


def describe_api_error(what: str, e: BaseException) -> str:
    """One line naming the resource, the status and the fix."""
    if isinstance(e, _api_exception()):
        message = e.reason or ""
        with contextlib.suppress(ValueError, AttributeError):
            message = json.loads(e.body or "{}").get("message") or message
        if e.status == 403:
            return (
                f"{what}: forbidden (403): {message}; give the EPP's ServiceAccount get/list/"
                "watch on pods and inferencepools (deploy/kubernetes/gateway/base/rbac.yaml)"
            )
        if e.status == 401:
            return f"{what}: unauthorized (401): {message}; check --kubeconfig or the pod's token"
        if e.status == 404:
            return (
                f"{what}: not found (404): {message}; is the InferencePool CRD"
                " (inference.networking.k8s.io/v1) installed in the cluster?"
            )
        return f"{what}: API error {e.status}: {message}"
    return f"{what}: cannot reach the API server: {type(e).__name__}: {e}"


class Reflector:
    """Keeps `on_sync(selector, objects)` fed with the current objects of one list call.

    `list_fn(*args, **kw)` is a `kubernetes` client list method (e.g.
    `CoreV1Api.list_namespaced_pod`, `CustomObjectsApi.list_namespaced_custom_object`).
    `on_sync` and `on_error` run on the reflector's thread; `on_error(None)` means healthy.
    The `selector` passed to `on_sync` is the label selector the objects were listed
    with, so a caller can ignore a set listed under a selector it has since replaced.
    """

    def __init__(
        self,
        what: str,
        list_fn: Callable[..., Any],
        args: tuple[Any, ...],
        on_sync: Callable[[str | None, Objects], None],
        on_error: Callable[[str | None], None],
        label_selector: str | None = None,
        field_selector: str | None = None,
        timing: WatchTiming = WatchTiming(),
    ) -> None:
        self.what = what
        self._list_fn = list_fn
        self._args = args
        self._on_sync = on_sync
        self._on_error = on_error
        self._label_selector = label_selector
        self._field_selector = field_selector
        self.timing = timing
        self._stop = threading.Event()
        self._restart = threading.Event()
        self._lock = threading.Lock()
        self._wake = threading.Event()  # set by stop() and set_label_selector(): ends sleeps
        self._response: Any = None  # the open watch response (urllib3), to interrupt
        self._thread: threading.Thread | None = None
        self._failures = 0
        self.lists = 0  # how many full lists were made (for logs and tests)
        self.resource_version = ""  # the last one seen: list, event or bookmark

    # ---- control (any thread) -------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"k8s {self.what}", daemon=True)
            self._thread.start()

    @property
    def started(self) -> bool:
        return self._thread is not None

    def set_label_selector(self, selector: str) -> None:
        """Relist under a new selector (starts the reflector if it was not running)."""
        with self._lock:
            self._label_selector = selector
            self._restart.set()
            self._wake.set()
            self._interrupt()
        self.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        with self._lock:
            self._wake.set()
            self._interrupt()
        if self._thread is not None:
            self._thread.join(timeout)

    def _interrupt(self) -> None:
        """Shut the open watch's socket down (caller holds the lock): its read returns."""
        sock = getattr(getattr(self._response, "connection", None), "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _interrupted(self) -> bool:
        return self._stop.is_set() or self._restart.is_set()

    # ---- the loop (reflector thread) ------------------------------------------
    def _run(self) -> None:
        self._failures = 0  # consecutive; reset once a watch is accepted (HTTP 200)
        while not self._stop.is_set():
            with self._lock:
                self._restart.clear()
                self._wake.clear()
                selector = self._label_selector
            try:
                objects, rv = self._list(selector)
                self.resource_version = rv
                self._on_sync(selector, objects)
                self._watch_from(selector, objects, rv)
            except _api_exception() as e:
                if self._interrupted():
                    continue
                if e.status == 410:
                    log.info("kubernetes %s: resourceVersion too old (410); relisting", self.what)
                    continue
                self._failures += 1
                self._on_error(describe_api_error(self.what, e))
            except Exception as e:  # urllib3/socket errors, bad JSON: retry, never die
                if self._interrupted():
                    continue
                self._failures += 1
                self._on_error(describe_api_error(self.what, e))
            if self._failures:
                self._wake.wait(self._backoff(self._failures))

    def _backoff(self, failures: int) -> float:
        t = self.timing
        delay = min(t.backoff_max, t.backoff_initial * 2 ** (failures - 1))
        return delay * random.uniform(0.8, 1.2)

    def _kwargs(self, selector: str | None) -> dict[str, Any]:
        kw: dict[str, Any] = {}
        if selector:
            kw["label_selector"] = selector
        if self._field_selector:
            kw["field_selector"] = self._field_selector
        return kw

    def _list(self, selector: str | None) -> tuple[Objects, str]:
        objects: Objects = {}
        token: str | None = None
        while True:
            kw = self._kwargs(selector)
            if token:
                kw["_continue"] = token
            resp = self._list_fn(
                *self._args,
                limit=self.timing.page_size,
                _preload_content=False,
                _request_timeout=(self.timing.connect_timeout, 60),
                **kw,
            )
            try:
                body = json.loads(resp.data)
            finally:
                resp.release_conn()
            for obj in body.get("items") or ():
                objects[obj["metadata"]["name"]] = obj
            meta = body.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                self.lists += 1
                return objects, str(meta.get("resourceVersion", ""))

    def _watch_from(self, selector: str | None, objects: Objects, rv: str) -> None:
        """Watch (re-opening from the last resourceVersion) until a relist is due."""
        t = self.timing
        deadline = time.monotonic() + t.relist_period
        empty_ends = 0
        while not self._interrupted():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return  # resync: relist
            timeout = max(1, int(min(t.watch_timeout, remaining)))
            events = 0
            opened = time.monotonic()
            try:
                stream = _raw_watch_class()().stream(
                    self._open_watch,
                    *self._args,
                    resource_version=rv,
                    timeout_seconds=timeout,
                    allow_watch_bookmarks=True,
                    _request_timeout=(t.connect_timeout, timeout + 30),
                    **self._kwargs(selector),
                )
                for event in stream:
                    events += 1
                    rv = self.resource_version = self._apply(event, objects, rv)
                    if event["type"] != "BOOKMARK":
                        self._on_sync(selector, objects)
            finally:
                with self._lock:
                    self._response = None
            if events == 0 and time.monotonic() - opened < timeout and not self._interrupted():
                # The server closed an empty watch early: do not spin on reconnects.
                empty_ends += 1
                self._wake.wait(self._backoff(empty_ends))
            else:
                empty_ends = 0

    def _open_watch(self, *args: Any, **kwargs: Any) -> Any:
        """The list call with watch=true; its response is registered for `_interrupt`.

        Returning at all means the server accepted the watch (an error status raises), so
        this is where the reflector counts as healthy again: a list that succeeds while
        the watch is refused (RBAC granting list but not watch) keeps the error standing.
        """
        resp = self._list_fn(*args, **kwargs)
        self._failures = 0
        self._on_error(None)
        with self._lock:
            self._response = resp
            if self._interrupted():  # a stop/restart came while the request was in flight
                self._interrupt()
        return resp

    @staticmethod
    def _apply(event: dict[str, Any], objects: Objects, rv: str) -> str:
        obj = event.get("object") or {}
        meta = obj.get("metadata") or {}
        rv = str(meta.get("resourceVersion") or rv)
        kind = event.get("type")
        if kind in ("ADDED", "MODIFIED"):
            objects[meta["name"]] = obj
        elif kind == "DELETED":
            objects.pop(meta.get("name", ""), None)
        return rv
