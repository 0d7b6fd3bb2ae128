"""The virtual connector over real gRPC: the planner publishes, the environment's
client watches, carries out and completes; an uncompleted decision holds the next one
back; counts that did not change publish nothing."""

from __future__ import annotations

import asyncio

from epp.planner.core.types import Decision, Replicas, Role
from epp.planner.live.connectors.base import apply
from epp.planner.live.connectors.client import VirtualClient
from epp.planner.live.connectors.virtual import VirtualConnector

P, D = Role.PREFILL, Role.DECODE


def decision(p: int, d: int) -> Decision:
    return Decision(at=0.0, targets={P: p, D: d}, reason="test")


async def test_round_trip_and_skip_until_completed():
    now = [0.0]
    conn = VirtualConnector((P, D), "127.0.0.1:0", clock=lambda: now[0])
    await conn.start()
    client = VirtualClient(f"127.0.0.1:{conn.port}")
    try:
        assert (await client.get()).decision_id == -1  # nothing yet
        watch = client.watch().__aiter__()
        await apply(conn, decision(1, 2))
        first = await asyncio.wait_for(watch.__anext__(), 10)
        assert (first.num_prefill_workers, first.num_decode_workers, first.decision_id) == (1, 2, 0)
        # published but not carried out: starting replicas, nothing ready yet
        assert conn.replicas() == {P: Replicas(starting=1), D: Replicas(starting=2)}

        now[0] = 10.0
        await apply(conn, decision(2, 2))  # decision 0 not completed: skipped
        assert (await client.get()).decision_id == 0

        assert await client.complete(first) == 0
        assert conn.replicas() == {P: Replicas(ready=1), D: Replicas(ready=2)}
        await apply(conn, decision(1, 2))  # unchanged: nothing published
        assert (await client.get()).decision_id == 0

        await apply(conn, decision(1, 1))  # one decode fewer
        second = await asyncio.wait_for(watch.__anext__(), 10)
        assert (second.num_prefill_workers, second.num_decode_workers) == (1, 1)
        assert second.decision_id == 1
        assert conn.replicas()[D] == Replicas(ready=2, draining=1)
        assert await client.complete(second) == 1
        assert conn.replicas()[D] == Replicas(ready=1)
    finally:
        await client.close()
        await conn.stop()


async def test_an_aggregated_pool_travels_in_num_decode_workers():
    conn = VirtualConnector((Role.AGGREGATED,), "127.0.0.1:0")
    await conn.start()
    client = VirtualClient(f"127.0.0.1:{conn.port}")
    try:
        await conn.set_replicas(Role.AGGREGATED, 3)
        got = await client.get()
        assert (got.num_prefill_workers, got.num_decode_workers, got.decision_id) == (-1, 3, 0)
    finally:
        await client.close()
        await conn.stop()


async def test_epp_serve_with_environment_virtual_publishes_the_floor():
    from epp.datastore import Endpoint
    from epp.planner.core.config import load_planner_file
    from epp.planner.live.loop import ManualTicks
    from epp.serve import EppServer, ServeOptions

    cfg = load_planner_file('mode: load\nenvironment: virtual\nvirtual-address: "127.0.0.1:0"\n')
    opts = ServeOptions(host="127.0.0.1", grpc_port=0, health_port=0, metrics_port=0,
                        scrape=False, endpoints=[Endpoint("e0", "127.0.0.1", 1)],
                        planner=cfg)  # fmt: skip
    server = EppServer(opts, planner_ticks=ManualTicks())
    await server.start()
    try:
        conn = server.planner.connector
        assert isinstance(conn, VirtualConnector)
        client = VirtualClient(f"127.0.0.1:{conn.port}")
        # min-endpoint 1: the planner asked the environment for one aggregated replica
        got = await client.get()
        assert (got.num_prefill_workers, got.num_decode_workers, got.decision_id) == (-1, 1, 0)
        await client.complete(got)
        assert conn.replicas() == {Role.AGGREGATED: Replicas(ready=1)}
        await client.close()
    finally:
        await server.stop()
