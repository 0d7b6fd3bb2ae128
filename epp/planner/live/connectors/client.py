"""The environment's side of the virtual connector (Dynamo's VirtualConnectorClient:
`wait`, `get`, `complete`), over gRPC."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from epp._proto_gen import planner_pb2 as pb
from epp._proto_gen import planner_pb2_grpc as pb_grpc


class VirtualClient:
    def __init__(self, address: str) -> None:
        self._channel = grpc.aio.insecure_channel(address)
        self._stub = pb_grpc.VirtualPlannerStub(self._channel)

    async def get(self) -> pb.PlannerDecision:
        return await self._stub.Get(pb.GetRequest())

    async def watch(self, after_decision_id: int = -1) -> AsyncIterator[pb.PlannerDecision]:
        """Every decision newer than `after_decision_id`, as it is published."""
        async for d in self._stub.Watch(pb.WatchRequest(after_decision_id=after_decision_id)):
            yield d

    async def complete(self, decision: pb.PlannerDecision) -> int:
        """Say `decision` was carried out; returns the planner's `scaled_decision_id`."""
        reply = await self._stub.Complete(pb.CompleteRequest(decision_id=decision.decision_id))
        return reply.scaled_decision_id

    async def close(self) -> None:
        await self._channel.close()
