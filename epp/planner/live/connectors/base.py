"""What every connector offers the planner loop: one interface, whatever carries the
decision out (processes on this machine, a Kubernetes scale subresource, an external
environment over gRPC).

Dynamo's connector ABC has only `add_component`/`remove_component` (±1, reference
§6.4); the planner then asks for targets. Here a connector takes the target itself
(`set_replicas(role, n)`), says what it has (`replicas()`: ready, starting, draining,
the counts `Observation.replicas` carries), and drains a named replica. `apply` is the
one way a `Decision` reaches a connector.

Pure: the Protocol and `apply` do no I/O themselves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from epp.planner.core.types import Decision, Replicas, Role


class Connector(Protocol):
    """Methods run on the EPP's event loop, except `replicas()` and `ready_names()`,
    which the planner thread calls and which must be safe from any thread."""

    async def start(self) -> None:
        """Adopt what already runs (a statefile, a cluster's state) and get ready."""

    async def stop(self) -> None:
        """Stop whatever this connector started and still owns."""

    def replicas(self) -> Mapping[Role, Replicas]:
        """Replicas per role by state, as this connector sees them now."""

    def ready_names(self) -> frozenset[str]:
        """Endpoint names of the ready replicas (the ones a scale-down may drain)."""

    async def set_replicas(self, role: Role, n: int, prefer_drain: Sequence[str] = ()) -> None:
        """Move `role` to `n` active replicas. Going down cancels starting replicas
        first, then drains ready ones, `prefer_drain` first. Returns once the change is
        under way (replicas starting or draining), not when it is done."""

    async def drain(self, name: str) -> None:
        """Take replica `name` out of scheduling at once, let its in-flight requests
        finish (up to the drain timeout) and then stop it."""


async def apply(connector: Connector, decision: Decision) -> None:
    """Carry out `decision`: each role to its target, scale-down victims as chosen. A
    connector that publishes whole decisions (the virtual one: one decision_id for
    prefill and decode together) offers `set_targets(targets, prefer_drain)`."""
    set_targets = getattr(connector, "set_targets", None)
    if set_targets is not None:
        await set_targets(dict(decision.targets), decision.drain)
        return
    for role, n in decision.targets.items():
        victims = [name for name in decision.drain if name in connector.ready_names()]
        await connector.set_replicas(role, n, prefer_drain=victims)
