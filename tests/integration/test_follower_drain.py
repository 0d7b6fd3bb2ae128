"""Two EPPs over one local pool (the leader's LocalConnector owns real `epp sim`
replicas; the follower's only mirrors the statefile, as `epp serve --planner` does on the
EPP that lost the election): a replica the leader drains is draining in the follower
too, so the follower stops routing new requests to it while its in-flight requests
finish, and drops it once the leader has stopped it."""

from __future__ import annotations

import asyncio
import random

from epp.config.loader import load_default_config
from epp.datastore import Datastore
from epp.director import Director
from epp.planner.core.types import Role
from epp.planner.live.connectors.local import LocalConnector
from epp.planner.live.connectors.statefile import WorkerRecord, decode, encode
from epp.scheduling.registry import Handle
from tests.eventually import eventually
from tests.helpers import completion
from tests.integration.test_connector_local import AGG, live


def test_the_statefile_keeps_the_draining_mark_and_old_files_read_as_not_draining():
    rec = WorkerRecord("aggregated-0", Role.AGGREGATED, 8000, 42, ("epp", "sim"), draining=True)
    assert decode(encode([rec])) == [rec]
    old = encode([rec]).replace('"draining": true', '"draining": "yes"')  # not a JSON true
    assert decode(old)[0].draining is False
    no_field = encode([rec]).replace(',\n      "draining": true', "")
    assert "draining" not in no_field and decode(no_field)[0].draining is False


async def test_a_follower_stops_routing_to_a_replica_the_leader_drains(tmp_path):
    params = live(tmp_path)
    statefile = tmp_path / "state" / "p.json"
    lead_ds, follow_ds = Datastore(require_metrics=False), Datastore(require_metrics=False)
    leader = LocalConnector(lead_ds, params, [AGG], pool="p")
    follower = LocalConnector(follow_ds, params, [AGG], pool="p")  # never started: a follower
    cfg = load_default_config(Handle(rng=random.Random(1)))
    director = Director(follow_ds, cfg.scheduler, cfg.pre_request, random.Random(1))
    await leader.start()
    try:
        await leader.set_replicas(AGG, 2)
        await leader.settle()
        follower.follow()
        names = sorted(e.name for e in follow_ds.endpoints())
        assert names == sorted(leader.ready_names()) and len(names) == 2
        victim, keeper = names
        # Before the drain the follower may pick either replica.
        assert {s.name for s in director.candidates(completion(), None)} == {victim, keeper}

        lead_ds.acquire(victim)  # a request in flight there (at the leader): the drain waits
        drain = asyncio.create_task(leader.drain(victim))
        await eventually(
            lambda: [r.name for r in decode(statefile.read_text()) if r.draining] == [victim],
            "the leader to record the drain",
        )
        follower.follow()  # the follower's next planner tick
        assert {s.name for s in director.candidates(completion(), None)} == {keeper}
        assert {s.name: s.draining for s in follow_ds.snapshot()} == {victim: True, keeper: False}
        assert not drain.done()  # still draining: its in-flight request has not ended

        lead_ds.release(victim)
        await asyncio.wait_for(drain, 30)
        follower.follow()
        assert [e.name for e in follow_ds.endpoints()] == [keeper]
        assert [r.name for r in decode(statefile.read_text())] == [keeper]
    finally:
        await leader.stop()
