"""Leader election with a Kubernetes Lease, against tests/fake_kube.py: a FAKE API server
(no real one can run on this machine) extended for this test with Leases (GET, POST,
PUT with resourceVersion conflicts, 403), served on loopback and reached through the
official client.

Time is a manual clock, so "the follower takes over within the lease time and never
two lead at once" is checked step by step, with no sleeps: after every step at most one
candidate's `is_leader()` is True."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging

import pytest

from epp.datalayer.k8s_discovery import load_api_client
from epp.election.lease import LeaseElector, LeaseTiming
from tests.fake_kube import FakeKubeAPI

NAME = "epp-planner-default"
TIMING = LeaseTiming(lease_duration=15, renew_deadline=10, retry_period=2)  # client-go's


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def wall(self) -> dt.datetime:
        return dt.datetime(2026, 11, 23, tzinfo=dt.UTC) + dt.timedelta(seconds=self.t)


@pytest.fixture
async def fake():
    api = FakeKubeAPI()
    await api.start()
    yield api
    await api.stop()


def candidates(fake, tmp_path, clock, *names):
    kubeconfig = fake.kubeconfig(tmp_path / "kubeconfig")
    return [
        LeaseElector(
            load_api_client(kubeconfig), "default", NAME, n, TIMING, clock=clock, wall=clock.wall
        )
        for n in names
    ]


async def step(*electors) -> list[bool]:
    """One round for each candidate, in order (the client is synchronous: a thread)."""
    out = [await asyncio.to_thread(e.try_acquire_or_renew) for e in electors]
    assert sum(e.is_leader() for e in electors) <= 1, "two leaders at once"
    return out


async def test_one_leads_and_the_other_takes_over_after_the_lease_expires(fake, tmp_path):
    clock = Clock()
    a, b = candidates(fake, tmp_path, clock, "a", "b")
    assert await step(a, b) == [True, False]  # a creates the Lease; b sees it held
    lease = fake.lease(NAME)
    assert lease["spec"]["holderIdentity"] == "a" and lease["spec"]["leaseDurationSeconds"] == 15
    # a renews every retry period; b never takes a renewed lease
    for _ in range(10):
        clock.t += 2
        assert await step(a, b) == [True, False]
    # a dies (no more renewals) after its last renewal at t0; b saw that renewal at t0.
    t0 = clock.t
    clock.t = t0 + TIMING.renew_deadline  # a's own deadline: it no longer claims to lead
    assert not a.is_leader()
    clock.t = t0 + 14.9  # b waits a whole lease duration without a change
    assert await step(b) == [False]
    clock.t = t0 + 15.1
    assert await step(b) == [True]
    lease = fake.lease(NAME)
    assert lease["spec"]["holderIdentity"] == "b" and lease["spec"]["leaseTransitions"] == 1
    # a comes back: it sees b's live lease and follows
    clock.t += 1
    assert await step(a, b) == [False, True]


async def test_a_leader_that_cannot_renew_stops_leading_before_anyone_can_take_over(fake, tmp_path):
    clock = Clock()
    a, b = candidates(fake, tmp_path, clock, "a", "b")
    await step(a, b)
    t0 = clock.t
    fake.forbid("leases", verbs=("update",))  # a's renewals fail from now on (403)
    clock.t = t0 + 9.9
    assert await step(a) == [False] and a.is_leader()  # still inside its renew deadline
    clock.t = t0 + 10.0
    assert not a.is_leader()  # 10 s renew deadline < 15 s lease: stops first
    fake.forbid("leases", forbidden=False)
    clock.t = t0 + 15.1
    assert await step(b) == [True]


async def test_two_candidates_writing_at_once_one_wins_by_resource_version(fake, tmp_path):
    clock = Clock()
    a, b, c = candidates(fake, tmp_path, clock, "a", "b", "c")
    await step(c)  # c leads, then dies
    clock.t += 20  # both a and b first observe c's lease now ...
    assert await step(a, b) == [False, False]
    clock.t += 16  # ... and both find it expired after a lease duration
    real_read = a._api.read_namespaced_lease

    def read_then_b_writes(*args, **kw):  # interleave: b's whole round between a's read and write
        lease = real_read(*args, **kw)
        assert b.try_acquire_or_renew()
        return lease

    a._api.read_namespaced_lease = read_then_b_writes
    assert await step(a) == [False]  # a's replace carried the old resourceVersion: 409
    assert fake.lease(NAME)["spec"]["holderIdentity"] == "b" and b.is_leader()
    assert "PUT" in fake.requests[-1]


async def test_stop_releases_the_lease_so_a_follower_takes_it_at_once(fake, tmp_path):
    clock = Clock()
    a, b = candidates(fake, tmp_path, clock, "a", "b")
    await step(a, b)
    await a.stop()  # never started its thread: stop() only releases
    assert fake.lease(NAME)["spec"].get("holderIdentity") is None and not a.is_leader()
    clock.t += 2  # one retry period, not a lease duration
    assert await step(b) == [True]


async def test_missing_rbac_is_named_in_the_log(fake, tmp_path, caplog):
    clock = Clock()
    [a] = candidates(fake, tmp_path, clock, "a")
    fake.forbid("leases", verbs=("get", "create", "update"))
    with caplog.at_level(logging.WARNING, logger="epp.election"):
        assert await step(a) == [False]
        assert await step(a) == [False]
    [line] = [r.message for r in caplog.records if "forbidden (403)" in r.message]  # once
    assert "leases.coordination.k8s.io" in line and "rbac.yaml" in line
