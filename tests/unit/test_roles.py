"""Per-role pool load: what the load-based planner reads in a P/D pool (prefill queue,
decode KV use), from snapshots and as /metrics gauges."""

from prometheus_client import CollectorRegistry, generate_latest

from epp.observability import PoolCollector
from epp.planner.core.types import Role
from epp.planner.core.window import PoolSample
from epp.roles import pool_samples, role_of
from tests.helpers import snap

PREFILL = {"llm-d.ai/role": "prefill"}
DECODE = {"llm-d.ai/role": "decode"}


def pd_pool():
    return [
        snap("p0", queue=4, running=1, kv=0.1, labels=PREFILL),
        snap("p1", queue=2, running=1, kv=0.3, labels=PREFILL),
        snap("d0", queue=0, running=8, kv=0.6, labels=DECODE),
        snap("d1", queue=1, running=6, kv=0.8, labels=DECODE),
        snap("d2", queue=9, running=9, kv=1.0, labels=DECODE, healthy=False),  # not counted
    ]


def test_role_of_maps_llm_d_labels_and_defaults_to_aggregated():
    assert role_of(snap("a", labels=PREFILL).endpoint) is Role.PREFILL
    assert role_of(snap("a", labels=DECODE).endpoint) is Role.DECODE
    assert role_of(snap("a", labels={"llm-d.ai/role": "both"}).endpoint) is Role.AGGREGATED
    assert role_of(snap("a").endpoint) is Role.AGGREGATED


def test_pool_samples_per_role_over_healthy_endpoints():
    by_role = {s.role: s for s in pool_samples(pd_pool())}
    # prefill: waiting 4 + 2, running 1 + 1, KV (0.1 + 0.3) / 2
    p = by_role[Role.PREFILL]
    assert (p.waiting, p.running, p.ready) == (6, 2, 2) and abs(p.kv_mean - 0.2) < 1e-9
    # decode: d2 is unhealthy, so waiting 0 + 1, running 8 + 6, KV (0.6 + 0.8) / 2
    assert by_role[Role.DECODE] == PoolSample(Role.DECODE, 1, 14, (0.6 + 0.8) / 2, 2)
    assert set(by_role) == {Role.PREFILL, Role.DECODE}


def test_role_gauges_on_metrics():
    registry = CollectorRegistry()
    registry.register(PoolCollector("pool", pd_pool))
    text = generate_latest(registry).decode()
    assert 'inference_pool_role_queue_size{name="pool",role="prefill"} 6.0' in text
    assert 'inference_pool_role_ready_pods{name="pool",role="decode"} 2.0' in text
    assert 'inference_pool_role_average_kv_cache_utilization{name="pool",role="decode"} 0.7' in text
