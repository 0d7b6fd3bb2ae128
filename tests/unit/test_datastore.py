"""Datastore: health from scrape age, in-flight counters, snapshot reuse."""

from epp.datastore import Datastore, Endpoint, EndpointMetrics


def make(now):
    ds = Datastore(staleness=2.0, clock=lambda: now[0])
    ds.set_endpoints([Endpoint("a", "10.0.0.1", 80), Endpoint("b", "10.0.0.2", 80)])
    return ds


def test_never_scraped_is_unhealthy_then_healthy_then_stale():
    now = [10.0]
    ds = make(now)
    assert [s.healthy for s in ds.snapshot()] == [False, False]
    ds.update_metrics("a", EndpointMetrics(waiting_queue_size=3, update_time=10.0))
    assert [s.healthy for s in ds.snapshot()] == [True, False]
    now[0] = 11.9
    assert ds.snapshot()[0].healthy
    now[0] = 12.1
    assert not ds.snapshot()[0].healthy  # stale by time alone
    ds.update_metrics("a", EndpointMetrics(update_time=12.1))
    assert ds.snapshot()[0].healthy  # recovery is automatic


def test_failed_scrape_marks_unhealthy_and_keeps_reason():
    now = [0.0]
    ds = make(now)
    ds.update_metrics("a", EndpointMetrics(update_time=0.0))
    ds.mark_scrape_failed("a", "connection refused")
    assert not ds.is_healthy("a")
    assert ds.last_error("a") == "connection refused"


def test_inflight_counts_show_in_snapshot_and_never_go_negative():
    ds = Datastore(require_metrics=False)
    ds.set_endpoints([Endpoint("a", "10.0.0.1", 80)])
    ds.acquire("a", 100)
    ds.acquire("a", 50)
    (s,) = ds.snapshot()
    assert (s.inflight_requests, s.inflight_tokens) == (2, 150)
    for _ in range(3):
        ds.release("a", 100)
    assert ds.inflight("a") == (0, 0)


def test_unchanged_endpoint_reuses_its_snapshot_object():
    ds = Datastore(require_metrics=False)
    ds.set_endpoints([Endpoint("a", "10.0.0.1", 80), Endpoint("b", "10.0.0.2", 80)])
    first = ds.snapshot()
    ds.acquire("b")
    second = ds.snapshot()
    assert second[0] is first[0]
    assert second[1] is not first[1] and second[1].inflight_requests == 1


def test_set_endpoints_keeps_state_of_known_endpoints():
    ds = Datastore(require_metrics=False)
    ds.set_endpoints([Endpoint("a", "10.0.0.1", 80)])
    ds.acquire("a")
    ds.set_endpoints([Endpoint("a", "10.0.0.1", 80), Endpoint("c", "10.0.0.3", 80)])
    assert ds.inflight("a") == (1, 0)
    assert ds.by_hostport("10.0.0.3:80").name == "c"
    ds.set_endpoints([Endpoint("c", "10.0.0.3", 80)])
    assert ds.get("a") is None and ds.inflight("a") == (0, 0)


async def test_listener_subscribed_in_a_loop_is_called_on_that_loop_thread():
    import asyncio
    import threading

    ds = Datastore(require_metrics=False)
    called_on: list[int] = []
    done = asyncio.Event()

    def listener() -> None:
        called_on.append(threading.get_ident())
        done.set()

    unsubscribe = ds.on_change(listener)
    await asyncio.to_thread(ds.set_endpoints, [Endpoint("a", "10.0.0.1", 80)])
    await asyncio.wait_for(done.wait(), 5)
    assert called_on == [threading.get_ident()]
    unsubscribe()
    ds.set_endpoints([])
    await asyncio.sleep(0)
    assert len(called_on) == 1


def test_prompt_tokens_leave_at_first_token_output_tokens_at_the_end():
    ds = Datastore(require_metrics=False)
    ds.set_endpoints([Endpoint("a", "10.0.0.1", 80)])
    ds.acquire("a", prompt_tokens=100, output_tokens=30)
    ds.acquire("a", prompt_tokens=50, output_tokens=20)
    (s,) = ds.snapshot()
    # tokens = prompts 100 + 50 + outputs 30 + 20; prefill = prompts only
    assert (s.inflight_requests, s.inflight_tokens, s.inflight_prefill_tokens) == (2, 200, 150)
    ds.prefill_done("a", 100)  # the first request's first token
    (s,) = ds.snapshot()
    assert (s.inflight_requests, s.inflight_tokens, s.inflight_prefill_tokens) == (2, 100, 50)
    ds.release("a", prompt_tokens=0, output_tokens=30)  # it ends
    ds.release("a", prompt_tokens=50, output_tokens=20)  # the other ends before any token
    assert ds.inflight("a") == (0, 0) and ds.snapshot()[0].inflight_prefill_tokens == 0


def test_incremental_snapshot_equals_a_full_rebuild_after_any_sequence():
    """`snapshot()` rebuilds only what changed (and staleness when due): after 3,000
    random operations it must always equal a snapshot built from scratch."""
    import random

    rng = random.Random(7)
    now = [0.0]
    eps = [Endpoint(f"e{i}", f"10.0.0.{i}", 80) for i in range(12)]
    fast = Datastore(staleness=2.0, clock=lambda: now[0])
    full = Datastore(staleness=2.0, clock=lambda: now[0])
    members = eps[:8]
    for ds in (fast, full):
        ds.set_endpoints(members)
    for step in range(3000):
        op = rng.randrange(8)
        name = rng.choice(members).name
        waiting, coin = rng.randrange(5), rng.random() < 0.5  # the same for both
        for ds in (fast, full):
            if op == 0:
                ds.update_metrics(name, EndpointMetrics(waiting, update_time=now[0]))
            elif op == 1:
                ds.mark_scrape_failed(name, "boom")
            elif op == 2:
                ds.acquire(name, 3, 4)
            elif op == 3:
                ds.release(name, 3, 4)
            elif op == 4:
                ds.set_draining(name, coin)
            elif op == 5:
                ds.set_models(name, ["m"] if coin else [])
        if op == 6:
            members = rng.sample(eps, rng.randrange(1, len(eps)))
            for ds in (fast, full):
                ds.set_endpoints(members)
        if op == 7:
            now[0] += rng.choice((0.01, 0.5, 1.5, 2.5))  # some steps make views stale
        full._view = None  # force the from-scratch build
        assert fast.snapshot() == full.snapshot(), f"step {step}"


def test_oldest_pending_is_the_oldest_request_without_its_first_byte():
    """`oldest_pending_at` follows the requests in any order of first bytes and ends, and
    is stamped with the in-flight clock (the server's real time), not the health clock."""
    now, real = [0.0], [100.0]
    ds = Datastore(require_metrics=False, clock=lambda: now[0], inflight_clock=lambda: real[0])
    ds.set_endpoints([Endpoint("a", "10.0.0.1", 80), Endpoint("b", "10.0.0.2", 80)])
    assert [s.oldest_pending_at for s in ds.snapshot()] == [None, None]
    t1 = ds.acquire("a", 1500, 32)
    real[0] = 100.2
    t2 = ds.acquire("a", 40, 16)
    real[0] = 100.3
    t3 = ds.acquire("a", 40, 16)
    assert len({t1, t2, t3}) == 3 and 0 not in (t1, t2, t3)
    assert ds.snapshot()[0].oldest_pending_at == 100.0
    assert ds.snapshot()[1].oldest_pending_at is None  # b has nothing in flight
    ds.prefill_done("a", 40, t2)  # a younger one's first byte: the oldest is unchanged
    assert ds.snapshot()[0].oldest_pending_at == 100.0
    ds.prefill_done("a", 1500, t1)  # the oldest's first byte: t3 is now the oldest
    assert ds.snapshot()[0].oldest_pending_at == 100.3
    ds.release("a", 0, 32, t1)  # ending after its first byte changes nothing
    assert ds.snapshot()[0].oldest_pending_at == 100.3
    ds.release("a", 40, 16, t3)  # ended without a first byte (client gone)
    (a, _) = ds.snapshot()
    assert a.oldest_pending_at is None
    assert (a.inflight_requests, a.inflight_prefill_tokens) == (1, 0)
    assert ds.acquire("gone") == 0  # not in the pool: no ticket, nothing counted


def test_director_releases_the_pending_age_at_the_first_token_and_at_the_end():
    """A routed request is pending on its pick until the response's first token; a
    request that ends without one (reset, client gone) leaves at the end."""
    import random

    from epp.config.loader import load_default_config
    from epp.director import Director
    from epp.scheduling.registry import Handle
    from tests.helpers import completion

    real = [5.0]
    ds = Datastore(require_metrics=False, inflight_clock=lambda: real[0])
    ds.set_endpoints([Endpoint("a", "10.0.0.1", 80)])
    cfg = load_default_config(Handle(rng=random.Random(0)))
    d = Director(ds, cfg.scheduler, cfg.pre_request)
    first = d.route(completion("x" * 400), None)
    real[0] = 6.0
    second = d.route(completion("y" * 400), None)
    assert ds.snapshot()[0].oldest_pending_at == 5.0
    d.first_token(first)
    assert ds.snapshot()[0].oldest_pending_at == 6.0
    d.release(first)
    d.release(second)  # no first token: it leaves at its end
    (a,) = ds.snapshot()
    assert a.oldest_pending_at is None and a.inflight_requests == 0
