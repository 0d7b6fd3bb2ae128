"""Leader election among EPP pods with a Kubernetes Lease (coordination.k8s.io/v1).

The algorithm is client-go's (`tools/leaderelection/leaderelection.go`,
`tryAcquireOrRenew`), which the upstream EPP uses through controller-runtime
(`--ha-enable-leader-election`), with its defaults: lease duration 15 s, renew deadline
10 s, retry period 2 s.

- Every `retry_period` a candidate reads the Lease. Absent: it creates it, naming
  itself. Held by another: it notes when it last saw the record *change* (holder,
  renewTime, resourceVersion) on its own monotonic clock, and takes the Lease only once
  `leaseDurationSeconds` passed without a change, so clocks of different machines are
  never compared. Held by itself, expired, or released (no holder): it writes itself as
  holder with the resourceVersion it read, so of two candidates writing at once the API
  server accepts one (409 Conflict for the other).
- The leader renews every `retry_period`. `is_leader()` is True only until
  `renew_deadline` after the start of the last successful renewal: the others cannot win
  before `lease_duration` after they saw that renewal, and renew_deadline < lease_duration,
  so the old leader stops acting before a new one can start, even when its API calls hang.
- `stop()` releases the Lease (no holder, duration 1 s) so a follower takes over at its
  next retry, as client-go's `ReleaseOnCancel`.

Why not the client package's `kubernetes.leaderelection`: its loop cannot be stopped,
reads the wall clock (no injected clock, so no deterministic test) and never releases.
The API calls are the official client's (`CoordinationV1Api`), in one thread (the client
is synchronous, like the discovery's).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("epp.election")


@dataclass(frozen=True, slots=True)
class LeaseTiming:
    """client-go's LeaderElectionConfig durations (seconds), defaults as upstream."""

    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError(
                "leader election needs 0 < retry period < renew deadline < lease duration "
                f"(got {self.retry_period:g}, {self.renew_deadline:g}, {self.lease_duration:g})"
            )


def _micro_time(t: dt.datetime) -> str:
    """A MicroTime as the API server parses it (RFC 3339 with exactly 6 fraction digits)."""
    return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _wall() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class LeaseElector:
    def __init__(
        self,
        api_client: Any,
        namespace: str,
        name: str,
        identity: str,
        timing: LeaseTiming = LeaseTiming(),
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], dt.datetime] = _wall,
    ) -> None:
        from kubernetes import client

        self._api = client.CoordinationV1Api(api_client)
        self._api_exception = client.ApiException
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.timing = timing
        self.clock = clock
        self.wall = wall
        self._renewed_at: float | None = None  # start of the last successful write
        self._observed: tuple[object, ...] | None = None
        self._observed_at = 0.0
        self._last_error = ""
        self._was_leader = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def describe(self) -> str:
        t = self.timing
        return (
            f"leader election: Lease {self.namespace}/{self.name} as {self.identity} "
            f"(duration {t.lease_duration:g}s, renew deadline {t.renew_deadline:g}s, "
            f"retry {t.retry_period:g}s)"
        )

    def is_leader(self) -> bool:
        renewed = self._renewed_at
        return renewed is not None and self.clock() < renewed + self.timing.renew_deadline

    # ---- one round (the thread calls it every retry period; tests call it directly)
    def try_acquire_or_renew(self) -> bool:
        now = self.clock()
        try:
            lease = self._api.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=self._timeout()
            )
        except self._api_exception as e:
            if e.status != 404:
                return self._failed(e)
            return self._write(now, None, holder="", transitions=0, acquired=None)
        except Exception as e:  # connection refused, timeout: retry next period
            return self._failed(e)
        spec = lease.spec
        holder = spec.holder_identity or ""
        seen = (holder, spec.renew_time, lease.metadata.resource_version)
        if seen != self._observed:
            self._observed, self._observed_at = seen, now
        if holder and holder != self.identity:
            duration = spec.lease_duration_seconds or self.timing.lease_duration
            if now < self._observed_at + duration:
                self._renewed_at = None  # someone else holds a live lease
                return False
        return self._write(
            now,
            lease.metadata.resource_version,
            holder=holder,
            transitions=spec.lease_transitions or 0,
            acquired=spec.acquire_time,
        )

    def _write(
        self, now: float, rv: str | None, *, holder: str, transitions: int, acquired: Any
    ) -> bool:
        stamp = _micro_time(self.wall())
        mine = holder == self.identity
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": math.ceil(self.timing.lease_duration),
            "renewTime": stamp,
            "acquireTime": _micro_time(acquired) if mine and acquired else stamp,
            "leaseTransitions": transitions if mine or rv is None else transitions + 1,
        }
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": spec,
        }
        try:
            if rv is None:
                self._api.create_namespaced_lease(
                    self.namespace, body, _request_timeout=self._timeout()
                )
            else:
                body["metadata"]["resourceVersion"] = rv
                self._api.replace_namespaced_lease(
                    self.name, self.namespace, body, _request_timeout=self._timeout()
                )
        except self._api_exception as e:
            if e.status == 409:  # another candidate wrote first (AlreadyExists / Conflict)
                self._renewed_at = None
                return False
            return self._failed(e)
        except Exception as e:
            return self._failed(e)
        self._renewed_at = now
        self._last_error = ""
        return True

    def _failed(self, e: Exception) -> bool:
        status = getattr(e, "status", None)
        if status == 403:
            msg = (
                f"Lease {self.namespace}/{self.name}: forbidden (403); give the EPP's "
                "ServiceAccount get/create/update on leases.coordination.k8s.io "
                "(deploy/kubernetes/gateway/base/rbac.yaml)"
            )
        else:
            reason = getattr(e, "reason", None) or type(e).__name__
            msg = f"Lease {self.namespace}/{self.name}: {status or ''} {reason}".replace("  ", " ")
        if msg != self._last_error:
            log.warning("leader election: %s; retrying every %gs", msg, self.timing.retry_period)
            self._last_error = msg
        return False  # a leader keeps is_leader() until its renew deadline passes

    def _timeout(self) -> float:
        return self.timing.retry_period

    # ---- the thread --------------------------------------------------------
    async def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="epp-leader-lease", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.try_acquire_or_renew()
            self._log_change()
            self._stop.wait(self.timing.retry_period)

    def _log_change(self) -> None:
        leader = self.is_leader()
        if leader != self._was_leader:
            if leader:
                log.info("leader election: %s leads (Lease %s)", self.identity, self.name)
            else:
                log.warning(
                    "leader election: %s lost Lease %s (not renewed within %gs)",
                    self.identity, self.name, self.timing.renew_deadline,
                )  # fmt: skip
            self._was_leader = leader

    async def stop(self, release: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10)
            self._thread = None
        if release and self._renewed_at is not None:
            await asyncio.to_thread(self.release)

    def release(self) -> None:
        """Give the Lease up at once (holder cleared, duration 1 s), if still ours."""
        self._renewed_at = None
        try:
            lease = self._api.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=self._timeout()
            )
            if (lease.spec.holder_identity or "") != self.identity:
                return
            stamp = _micro_time(self.wall())
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": self.name,
                    "namespace": self.namespace,
                    "resourceVersion": lease.metadata.resource_version,
                },
                "spec": {
                    "holderIdentity": None,
                    "leaseDurationSeconds": 1,
                    "renewTime": stamp,
                    "acquireTime": stamp,
                    "leaseTransitions": lease.spec.lease_transitions or 0,
                },
            }
            self._api.replace_namespaced_lease(
                self.name, self.namespace, body, _request_timeout=self._timeout()
            )
            log.info("leader election: %s released Lease %s", self.identity, self.name)
        except Exception as e:  # the lease then expires by itself
            log.warning("leader election: could not release Lease %s: %s", self.name, e)
