"""`epp serve` flags for leader election, checked into an `ElectionSpec` before any port
opens, and the elector the spec builds once the server starts.

Only the planner is elected: routing is active-active whatever these flags say. The
upstream EPP's `--ha-enable-leader-election` is active-passive instead (only the leader
is Ready, gie-epp.md §1.2); here every replica routes and the flags name no readiness.
"""

from __future__ import annotations

import argparse
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from epp.election.base import AlwaysLeader, Elector
from epp.election.lease import LeaseTiming

KINDS = ("auto", "off", "lock-file", "lease")


class ElectionError(ValueError):
    """A leader-election flag that cannot work; the message names the flag."""


@dataclass(frozen=True, slots=True)
class ElectionSpec:
    kind: str  # "lock-file" | "lease"
    identity: str
    timing: LeaseTiming
    lock_path: Path | None = None
    lease_namespace: str = "default"
    lease_name: str = ""
    kubeconfig: str | None = None


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("leader election (several EPPs with --planner: one planner acts)")
    g.add_argument(
        "--leader-election",
        choices=KINDS,
        default="auto",
        help="auto (default): with --planner, a Kubernetes Lease when running in a pod, "
        "else a lock file; off: this planner always acts (one EPP only)",
    )
    g.add_argument(
        "--leader-lock",
        metavar="FILE",
        default=None,
        help="lock-file election: the lock (default: the planner statefile + .lock)",
    )
    g.add_argument(
        "--leader-lease",
        metavar="NAME",
        default=None,
        help="lease election: the Lease's name (default epp-planner-<pool-name>)",
    )
    g.add_argument(
        "--leader-lease-namespace",
        metavar="NS",
        default=None,
        help="lease election: its namespace (default: the planner's kubernetes-namespace "
        "with environment kubernetes, else $NAMESPACE, else 'default')",
    )
    d = LeaseTiming()
    for flag, default, what in (
        ("--leader-lease-duration", d.lease_duration, "a follower waits this long without "
         "seeing the Lease renewed before it takes over"),
        ("--leader-renew-deadline", d.renew_deadline, "the leader stops acting when it could "
         "not renew for this long (< lease duration)"),
        ("--leader-retry-period", d.retry_period, "between attempts to take or renew the "
         "Lease, or to take the lock file"),
    ):  # fmt: skip
        g.add_argument(
            flag, type=float, default=default, metavar="SECONDS", help=f"{what} ({default:g})"
        )
    g.add_argument(
        "--leader-identity",
        default=None,
        help="this candidate's name in the lock/Lease (default <hostname>/<pid>)",
    )


def spec_from_args(
    args: argparse.Namespace,
    *,
    has_planner: bool,
    environment: str | None,
    statefile: Path | None,
    kube_namespace: str | None,
    pool: str,
) -> ElectionSpec | None:
    """The election the flags ask for; None: no election (no planner, or `off`)."""
    kind = args.leader_election
    if not has_planner:
        if kind in ("lock-file", "lease"):
            raise ElectionError(
                f"--leader-election {kind}: only the planner is elected; add --planner FILE"
            )
        _refuse(args, _LOCK_FLAGS + _LEASE_FLAGS, "without --planner (only the planner is elected)")
        return None
    if kind == "off":
        _refuse(args, _LOCK_FLAGS + _LEASE_FLAGS, "with --leader-election off")
        return None
    if kind == "auto":
        kind = "lease" if os.environ.get("KUBERNETES_SERVICE_HOST") else "lock-file"
    _refuse(args, _LEASE_FLAGS if kind == "lock-file" else _LOCK_FLAGS, f"with a {kind} election")
    try:
        timing = LeaseTiming(
            args.leader_lease_duration, args.leader_renew_deadline, args.leader_retry_period
        )
    except ValueError as e:
        raise ElectionError(
            f"--leader-retry-period < --leader-renew-deadline < --leader-lease-duration: {e}"
        ) from None
    identity = args.leader_identity or f"{socket.gethostname()}/{os.getpid()}"
    if kind == "lock-file":
        if args.leader_lock:
            lock = Path(os.path.expanduser(args.leader_lock))
        elif statefile is not None:
            lock = statefile.with_name(statefile.name + ".lock")
        else:
            raise ElectionError("--leader-election lock-file needs --leader-lock FILE")
        return ElectionSpec("lock-file", identity, timing, lock_path=lock)
    if environment == "kubernetes" and kube_namespace and args.leader_lease_namespace is None:
        namespace = kube_namespace  # beside the workloads the planner scales
    else:
        namespace = args.leader_lease_namespace or os.environ.get("NAMESPACE") or "default"
    name = args.leader_lease or f"epp-planner-{pool}"
    from epp.datalayer.k8s_discovery import load_api_client

    load_api_client(getattr(args, "kubeconfig", None)).close()  # no credentials: exit 2 now
    return ElectionSpec(
        "lease",
        identity,
        timing,
        lease_namespace=namespace,
        lease_name=name,
        kubeconfig=getattr(args, "kubeconfig", None),
    )


_LOCK_FLAGS = ("leader_lock",)
_LEASE_FLAGS = ("leader_lease", "leader_lease_namespace")


def _refuse(args: argparse.Namespace, names: tuple[str, ...], why: str) -> None:
    """A flag that would do nothing is an error, not silently ignored."""
    for name in names:
        if getattr(args, name) is not None:
            raise ElectionError(f"--{name.replace('_', '-')} does nothing {why}")


def build_elector(spec: ElectionSpec | None) -> Elector:
    """The elector for `spec` (a lone EPP's `AlwaysLeader` for None)."""
    if spec is None:
        return AlwaysLeader()
    if spec.kind == "lock-file":
        from epp.election.lockfile import LockFileElector

        assert spec.lock_path is not None
        return LockFileElector(spec.lock_path, spec.identity, spec.timing.retry_period)
    from epp.datalayer.k8s_discovery import load_api_client
    from epp.election.lease import LeaseElector

    return LeaseElector(
        load_api_client(spec.kubeconfig),
        spec.lease_namespace,
        spec.lease_name,
        spec.identity,
        spec.timing,
    )
