"""The planner thread follows its elector: a follower samples the pool but never decides
or calls the connector (not even start/stop); the tick that finds it leading takes over
(connector started, floor applied) and decides from then on; a leader that loses the
election stops acting at that tick. The elector is a settable flag (the real ones are
tested in test_election_lockfile.py and test_leader_lease.py); ticks are manual."""

from __future__ import annotations

import asyncio

from epp.planner.live.loop import stop_live_planner
from tests.unit.test_planner_loop import AGG, setup


class Flag:
    identity = "me"

    def __init__(self, leads: bool) -> None:
        self.leads = leads

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def is_leader(self) -> bool:
        return self.leads

    def describe(self) -> str:
        return "a flag"


class CountingPool:
    """Wraps the test pool: counts start/stop so a follower's silence is visible."""

    def __init__(self, pool) -> None:
        self.pool, self.starts, self.stops = pool, 0, 0

    def __getattr__(self, name):
        return getattr(self.pool, name)

    async def start(self) -> None:
        self.starts += 1

    async def stop(self) -> None:
        self.stops += 1


async def test_a_follower_decides_nothing_until_it_leads_then_acts(tmp_path):
    _, pool, policy, ticks, thread = setup(tmp_path)
    elector = Flag(False)
    counting = CountingPool(pool)
    thread.elector, thread.connector, thread.floor = elector, counting, 1
    try:
        for now in (0.0, 1.0, 2.0, 3.0, 4.0):  # two adjustment intervals (2 s) as follower
            await asyncio.to_thread(ticks.advance, now)
        assert policy.seen == [] and pool.calls == [] and counting.starts == 0
        assert not thread.acting and not thread.took_over

        elector.leads = True
        for now in (5.0, 6.0):  # 5: takes over; 6: the first decision as leader
            await asyncio.to_thread(ticks.advance, now)
        assert counting.starts == 1 and thread.acting
        [obs] = policy.seen
        assert obs.start == 4.0  # the follower kept one interval, not its whole history
        await asyncio.wrap_future(thread.last_apply)
        assert [c[:2] for c in pool.calls] == [(AGG, 3)]  # 2 ready + 1 (the Recording policy)

        elector.leads = False  # the lease was lost
        for now in (7.0, 8.0):
            await asyncio.to_thread(ticks.advance, now)
        assert not thread.acting and len(policy.seen) == 1 and len(pool.calls) == 1
    finally:
        await stop_live_planner(thread)
    assert counting.stops == 1  # it took over once, so it stops what it owns


async def test_a_follower_that_never_led_stops_nothing(tmp_path):
    _, pool, _, ticks, thread = setup(tmp_path)
    counting = CountingPool(pool)
    thread.elector, thread.connector = Flag(False), counting
    await asyncio.to_thread(ticks.advance, 0.0)
    thread.wake_from_zero()  # a follower never starts a replica, even from zero
    await stop_live_planner(thread)
    assert counting.starts == counting.stops == 0 and pool.calls == []
