"""`epp serve` flags for Kubernetes discovery, and their validation into a `KubeSource`.

Flags follow the upstream EPP (`pkg/epp/server/options.go`, gie-epp.md §2.5):
`--pool-name` xor `--endpoint-selector` (+ `--endpoint-target-ports`), `--pool-namespace`
falling back to `$NAMESPACE`, then `default`. Kubernetes discovery and the static
`--endpoints`/`--endpoint` lists are exclusive: one source owns the pool.
"""

from __future__ import annotations

import argparse
import os

from epp.datalayer.k8s_discovery import KubeSource
from epp.datalayer.k8s_pods import PoolSpec, PoolSpecError, parse_label_selector, parse_target_ports

__all__ = ["add_arguments", "source_from_args"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("Kubernetes discovery")
    g.add_argument(
        "--pool-name",
        default=None,
        help="watch this InferencePool (inference.networking.k8s.io/v1) and its Ready pods;"
        " also the name label of inference_pool_* gauges (default 'default')",
    )
    g.add_argument(
        "--pool-namespace",
        default=None,
        help="namespace of the pool and its pods (default $NAMESPACE, else 'default')",
    )
    g.add_argument(
        "--endpoint-selector",
        default=None,
        metavar="LABEL=VALUE,...",
        help="without an InferencePool: the Ready pods matching this label selector",
    )
    g.add_argument(
        "--endpoint-target-ports",
        default=None,
        metavar="PORT,...",
        help="with --endpoint-selector: the model-server ports of each pod (1..8)",
    )
    g.add_argument(
        "--kubeconfig",
        default=None,
        metavar="FILE",
        help="kubeconfig to use (default: in-cluster ServiceAccount, else ~/.kube/config)",
    )


def source_from_args(args: argparse.Namespace) -> KubeSource | None:
    """The Kubernetes source the flags ask for, None for static endpoints; PoolSpecError."""
    pool, selector = args.pool_name, args.endpoint_selector
    if args.endpoint_target_ports is not None and selector is None:
        raise PoolSpecError(
            "--endpoint-target-ports goes with --endpoint-selector; an InferencePool's"
            " ports come from its spec.targetPorts"
        )
    if pool is None and selector is None:
        for flag in ("pool_namespace", "kubeconfig"):
            if getattr(args, flag) is not None:
                name = "--" + flag.replace("_", "-")
                raise PoolSpecError(f"{name} needs --pool-name or --endpoint-selector")
        return None
    if pool is not None and selector is not None:
        raise PoolSpecError("give --pool-name or --endpoint-selector, not both")
    if args.endpoints or args.endpoint:
        raise PoolSpecError(
            "--endpoints/--endpoint and Kubernetes discovery (--pool-name/--endpoint-selector)"
            " are exclusive: one source owns the pool"
        )
    namespace = args.pool_namespace or os.environ.get("NAMESPACE") or "default"
    if pool is not None:
        if not pool.strip():
            raise PoolSpecError("--pool-name: must be a non-empty InferencePool name")
        return KubeSource(namespace=namespace, pool_name=pool.strip(), kubeconfig=args.kubeconfig)
    if args.endpoint_target_ports is None:
        raise PoolSpecError("--endpoint-selector needs --endpoint-target-ports (e.g. 8000)")
    spec = PoolSpec(
        selector=tuple(sorted(parse_label_selector(selector).items())),
        ports=parse_target_ports(args.endpoint_target_ports),
    )
    return KubeSource(namespace=namespace, selector=spec, kubeconfig=args.kubeconfig)
