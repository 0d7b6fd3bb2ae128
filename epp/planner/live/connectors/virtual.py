"""Virtual connector: the planner decides, an external environment acts (Dynamo's
`environment: virtual`, Dynamo's VirtualConnector, reference §6.1), over gRPC instead
of etcd keys (proto/planner.proto).

The environment calls `Watch` (or `Get`), carries out `{num_prefill_workers,
num_decode_workers, decision_id}` and calls `Complete(decision_id)`. The rules of
which decision is published live in the pure `board.DecisionBoard` (unchanged counts
skipped; a new decision waits for the last one's completion, up to 1800 s). An
aggregated pool's count travels in `num_decode_workers` (`num_prefill_workers` -1), as
Dynamo's aggregated mode sizes it with the decode formula.

The environment owns its endpoints (the EPP learns them from --endpoints or
Kubernetes), so `ready_names()` is empty and drain victims are the environment's choice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence

import grpc

from epp._proto_gen import planner_pb2 as pb
from epp._proto_gen import planner_pb2_grpc as pb_grpc
from epp.planner.core.types import Replicas, Role
from epp.planner.live.connectors.board import MAX_WAIT_S, DecisionBoard, Outcome, Published

log = logging.getLogger("epp.planner.virtual")


def _counts(roles: Sequence[Role], p: Published) -> dict[Role, int]:
    if roles == (Role.AGGREGATED,):
        return {Role.AGGREGATED: max(0, p.num_decode_workers)}
    return {Role.PREFILL: max(0, p.num_prefill_workers), Role.DECODE: max(0, p.num_decode_workers)}


def _message(p: Published) -> pb.PlannerDecision:
    return pb.PlannerDecision(
        num_prefill_workers=p.num_prefill_workers,
        num_decode_workers=p.num_decode_workers,
        decision_id=p.decision_id,
    )


class VirtualConnector(pb_grpc.VirtualPlannerServicer):
    def __init__(
        self,
        roles: Sequence[Role],
        address: str = "127.0.0.1:0",
        *,
        max_wait_s: float = MAX_WAIT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.roles = tuple(roles)
        self.address = address
        self.board = DecisionBoard(max_wait_s)
        self.clock = clock
        self.port = 0
        self._server: grpc.aio.Server | None = None
        self._changed: asyncio.Condition | None = None

    # ---- Connector ---------------------------------------------------------
    async def start(self) -> None:
        self._changed = asyncio.Condition()
        self._server = grpc.aio.server()
        pb_grpc.add_VirtualPlannerServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port(self.address)
        await self._server.start()
        log.info("planner: virtual connector serving decisions on port %d", self.port)

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=1.0)
            self._server = None

    def replicas(self) -> Mapping[Role, Replicas]:
        """Ready: the counts of the last completed decision; the way to the published
        one shows as starting (more) or draining (fewer)."""
        done = _counts(self.roles, self.board.completed)
        want = _counts(self.roles, self.board.current)
        return {
            r: Replicas(
                ready=done[r],
                starting=max(0, want[r] - done[r]),
                draining=max(0, done[r] - want[r]),
            )
            for r in self.roles
        }

    def ready_names(self) -> frozenset[str]:
        return frozenset()

    async def set_targets(self, targets: Mapping[Role, int], prefer_drain: Sequence[str] = ()):
        """Publish one decision for every role at once (one decision_id per decision)."""
        merged = {**_counts(self.roles, self.board.current), **targets}
        if self.roles == (Role.AGGREGATED,):
            p, d = -1, merged[Role.AGGREGATED]
        else:
            p, d = merged[Role.PREFILL], merged[Role.DECODE]
        outcome = self.board.update(self.clock(), p, d)
        if outcome is Outcome.PUBLISHED:
            log.info("planner: published decision %d", self.board.current.decision_id)
            await self._notify()
        elif outcome is Outcome.SKIPPED:
            log.info(
                "planner: decision %d not completed yet; new targets skipped",
                self.board.current.decision_id,
            )

    async def set_replicas(self, role: Role, n: int, prefer_drain: Sequence[str] = ()) -> None:
        await self.set_targets({role: n}, prefer_drain)

    async def drain(self, name: str) -> None:
        log.info("planner: the environment chooses what to drain (asked for %s)", name)

    async def _notify(self) -> None:
        assert self._changed is not None
        async with self._changed:
            self._changed.notify_all()

    # ---- the gRPC service --------------------------------------------------
    async def Get(self, request: pb.GetRequest, context) -> pb.PlannerDecision:
        return _message(self.board.current)

    async def Watch(self, request: pb.WatchRequest, context) -> AsyncIterator[pb.PlannerDecision]:
        assert self._changed is not None
        after = request.after_decision_id
        while True:
            current = self.board.current
            if current.decision_id > after:
                after = current.decision_id
                yield _message(current)
            async with self._changed:
                if self.board.current.decision_id <= after:
                    await self._changed.wait()

    async def Complete(self, request: pb.CompleteRequest, context) -> pb.CompleteReply:
        scaled = self.board.complete(request.decision_id)
        log.info("planner: the environment completed decision %d", request.decision_id)
        return pb.CompleteReply(scaled_decision_id=scaled)
