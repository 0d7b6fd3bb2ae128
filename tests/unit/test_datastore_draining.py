"""A draining endpoint is never picked, keeps counting its in-flight requests, and
drops out of the planner's pool samples."""

import random

import pytest

from epp.config.loader import load_default_config
from epp.datastore import Datastore, Endpoint, EndpointMetrics
from epp.director import Director
from epp.errors import EppError
from epp.roles import pool_samples
from epp.scheduling.registry import Handle
from tests.helpers import completion


def pool(n: int = 2) -> Datastore:
    ds = Datastore(require_metrics=False)
    ds.set_endpoints([Endpoint(f"e{i}", "127.0.0.1", 9000 + i) for i in range(n)])
    return ds


def director(ds: Datastore) -> Director:
    cfg = load_default_config(Handle(rng=random.Random(1)))
    return Director(ds, cfg.scheduler, cfg.pre_request, random.Random(1))


def test_draining_endpoint_is_never_picked_but_its_requests_finish():
    ds = pool()
    d = director(ds)
    first = d.route(completion(), None)
    busy = first.result.primary.targets[0].name
    ds.set_draining(busy)
    picks = {d.route(completion(), None).result.primary.targets[0].name for _ in range(20)}
    assert picks == {"e0", "e1"} - {busy}
    # the drained endpoint's request still counts until its response ends
    assert ds.inflight(busy)[0] == 1
    d.release(first)
    assert ds.inflight(busy)[0] == 0


def test_all_draining_is_a_clear_503():
    ds = pool(1)
    ds.set_draining("e0")
    with pytest.raises(EppError) as e:
        director(ds).route(completion(), None)
    assert e.value.status == 503 and "draining" in str(e.value)


def test_undrain_and_add_remove():
    ds = pool(1)
    ds.set_draining("e0")
    assert ds.snapshot()[0].draining
    ds.set_draining("e0", False)
    assert not ds.snapshot()[0].draining
    ds.add_endpoint(Endpoint("e1", "127.0.0.1", 9001))
    assert [e.name for e in ds.endpoints()] == ["e0", "e1"]
    ds.remove_endpoint("e0")
    assert [e.name for e in ds.endpoints()] == ["e1"]


def test_pool_samples_leave_draining_endpoints_out():
    ds = pool(2)
    ds.update_metrics("e0", EndpointMetrics(waiting_queue_size=4, kv_cache_usage=0.8))
    ds.update_metrics("e1", EndpointMetrics(waiting_queue_size=2, kv_cache_usage=0.2))
    ds.set_draining("e0")
    [s] = pool_samples(ds.snapshot())
    # only e1: waiting 2, KV 0.2, one ready replica
    assert (s.waiting, s.kv_mean, s.ready) == (2, 0.2, 1)


def test_admission_sink_sees_each_routed_request():
    ds = pool(1)
    d = director(ds)
    seen: list[int] = []
    d.admission_sinks.append(seen.append)
    req = completion("one two three")
    d.route(req, None)
    assert seen == [req.prompt_tokens_estimate]
