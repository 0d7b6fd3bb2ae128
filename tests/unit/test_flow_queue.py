"""Flow control's pure parts: the queue's order and bounds, and the `flowControl:` section."""

import math
import random

import pytest

from epp.composition import install_plugins
from epp.config.errors import ConfigError
from epp.config.loader import load_config_text
from epp.flowcontrol.config import duration, quantity
from epp.flowcontrol.queue import EDF, GLOBAL_STRICT, SLO_DEADLINE, BandLimits, FlowQueue, Item
from epp.scheduling.registry import Handle


def fill(q: FlowQueue, spec: list[tuple[int, str]]) -> list[Item]:
    items = []
    for i, (priority, flow) in enumerate(spec):
        item = Item(priority, flow, size=10, payload=f"{flow}{priority}#{i}")
        assert q.capacity_error(priority, 10) is None
        q.push(item)
        items.append(item)
    return items


def drain(q: FlowQueue) -> list[str]:
    out = []
    while (item := q.pop()) is not None:
        out.append(item.payload)
    return out


def test_higher_priority_bands_go_first_fcfs_within_one_flow():
    q = FlowQueue(100, 10_000)
    fill(q, [(0, "a"), (10, "a"), (5, "a"), (10, "a"), (0, "a")])
    assert drain(q) == ["a10#1", "a10#3", "a5#2", "a0#0", "a0#4"]
    assert (len(q), q.bytes) == (0, 0)


def test_round_robin_serves_the_flows_of_a_band_in_turn():
    q = FlowQueue(100, 10_000)
    # a sent 3 first, then b 1, then c 2: round robin gives a, b, c, a, c, a
    fill(q, [(0, "a"), (0, "a"), (0, "a"), (0, "b"), (0, "c"), (0, "c")])
    assert drain(q) == ["a0#0", "b0#3", "c0#4", "a0#1", "c0#5", "a0#2"]


def test_round_robin_is_per_band_and_priority_still_wins():
    q = FlowQueue(100, 10_000)
    fill(q, [(0, "a"), (0, "a"), (0, "b"), (7, "x"), (7, "y"), (7, "x")])
    assert drain(q) == ["x7#3", "y7#4", "x7#5", "a0#0", "b0#2", "a0#1"]


def test_global_strict_band_is_one_fcfs_queue():
    q = FlowQueue(100, 10_000, default_band=BandLimits(fairness=GLOBAL_STRICT))
    fill(q, [(0, "a"), (0, "a"), (0, "a"), (0, "b")])
    assert drain(q) == ["a0#0", "a0#1", "a0#2", "b0#3"]


def deadline_items(q: FlowQueue, deadlines: list[tuple[str, float, float]]) -> list[Item]:
    """(name, ttl deadline, slo deadline) pushed in this order, one flow, priority 0."""
    items = [Item(0, "a", 10, payload=n, ttl_deadline=t, slo_deadline=d) for n, t, d in deadlines]
    for item in items:
        q.push(item)
    return items


def test_edf_serves_the_earliest_ttl_deadline_first_then_fcfs_and_no_deadline_last():
    q = FlowQueue(100, 10_000, default_band=BandLimits(ordering=EDF))
    inf = math.inf
    # arrival order: late(30), none, soon(5), tie-1(10), tie-2(10), none-2
    deadline_items(
        q,
        [
            ("late", 30, 1),
            ("none", inf, 1),
            ("soon", 5, 9),
            ("tie-1", 10, 1),
            ("tie-2", 10, 1),
            ("none-2", inf, 1),
        ],
    )
    assert drain(q) == ["soon", "tie-1", "tie-2", "late", "none", "none-2"]


def test_slo_deadline_orders_by_the_ttft_deadline_not_the_ttl():
    q = FlowQueue(100, 10_000, default_band=BandLimits(ordering=SLO_DEADLINE))
    deadline_items(q, [("loose", 1, 20.0), ("no-slo", 1, math.inf), ("tight", 99, 0.3)])
    assert drain(q) == ["tight", "loose", "no-slo"]


def test_deadline_flows_remove_and_round_robin_like_fifo_ones():
    q = FlowQueue(100, 10_000, default_band=BandLimits(ordering=EDF))
    a = [Item(0, "a", 10, payload=f"a{d}", ttl_deadline=d) for d in (3.0, 1.0, 2.0)]
    b = [Item(0, "b", 10, payload=f"b{d}", ttl_deadline=d) for d in (9.0, 8.0)]
    for item in a + b:
        q.push(item)
    assert q.remove(a[1]) is True and q.remove(a[1]) is False  # a1 expired
    assert (len(q), q.bytes) == (4, 40)
    # flows take turns (a first: it became non-empty first); each in deadline order
    assert drain(q) == ["a2.0", "b8.0", "a3.0", "b9.0"]


def test_removing_a_waiting_item_keeps_the_rest_in_order_and_counts_right():
    q = FlowQueue(100, 10_000)
    items = fill(q, [(0, "a"), (0, "b"), (0, "a")])
    assert q.remove(items[1]) is True
    assert q.remove(items[1]) is False  # already gone
    assert (len(q), q.bytes) == (2, 20)
    assert drain(q) == ["a0#0", "a0#2"]


def test_capacity_bounds_global_and_per_band():
    q = FlowQueue(max_requests=3, max_bytes=100, bands={5: BandLimits(max_requests=1)})
    q.push(Item(5, "a", 10))
    assert "priority band 5 holds its maximum of 1 requests" in q.capacity_error(5, 10)
    assert q.capacity_error(0, 10) is None  # another band is not full
    q.push(Item(0, "a", 80))
    # 10 + 80 held; 11 more bytes pass the global 100
    assert "90 bytes; 11 more would pass its maximum of 100" in q.capacity_error(0, 11)
    assert q.capacity_error(0, 10) is None
    q.push(Item(0, "b", 10))
    assert "holds its maximum of 3 requests" in q.capacity_error(0, 0)


def test_empty_flows_are_forgotten():
    q = FlowQueue(100, 10_000)
    fill(q, [(0, f"tenant-{i}") for i in range(50)])
    drain(q)
    assert q.band(0).flows == {}


# --- the config section ---------------------------------------------------------------

HEAD = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"


def load(text: str):
    return load_config_text(HEAD + text, "fc.yaml", Handle(rng=random.Random(0)), install_plugins())


def error(text: str) -> str:
    with pytest.raises(ConfigError) as e:
        load(text)
    return str(e.value)


def test_upstream_section_loads_with_quantities_durations_and_policy_refs():
    cfg = load(
        "featureGates: [flowControl]\n"
        "plugins:\n- {name: rr, type: round-robin-fairness-policy}\n"
        "- {name: strict, type: global-strict-fairness-policy}\n"
        "- {name: lim, type: static-usage-limit-policy, parameters: {threshold: 0.9}}\n"
        "flowControl:\n  maxBytes: 10Gi\n  maxRequests: 1k\n  defaultRequestTTL: 1m30s\n"
        "  defaultPriorityBand: {maxBytes: 1Gi, maxRequests: 5000, fairnessPolicyRef: strict}\n"
        "  priorityBands:\n  - {priority: 100, maxBytes: 5Gi, maxRequests: 500,"
        " fairnessPolicyRef: rr, orderingPolicyRef: fcfs-ordering-policy}\n"
        "  usageLimitPolicyPluginRef: lim\n"
    ).flow_control
    assert (cfg.max_bytes, cfg.max_requests, cfg.ttl) == (10 * 2**30, 1000, 90.0)
    assert cfg.bands[100] == BandLimits(500, 5 * 2**30, "round-robin")
    assert cfg.default_band == BandLimits(5000, 2**30, GLOBAL_STRICT)
    assert cfg.ceiling == 0.9


def test_ordering_policy_refs_choose_the_band_ordering():
    cfg = load(
        "featureGates: [flowControl]\n"
        "plugins:\n- {name: deadline, type: edf-ordering-policy}\n"
        "flowControl:\n  defaultPriorityBand: {orderingPolicyRef: slo-deadline-ordering-policy}\n"
        "  priorityBands:\n  - {priority: 100, orderingPolicyRef: deadline}\n"
        "  - {priority: 5, orderingPolicyRef: fcfs-ordering-policy}\n"
    ).flow_control
    assert cfg.bands[100].ordering == EDF
    assert cfg.bands[5].ordering == "fcfs"
    assert cfg.default_band.ordering == SLO_DEADLINE
    assert "is not an ordering policy; use one of edf-ordering-policy" in error(
        "featureGates: [flowControl]\nflowControl: {priorityBands: [{priority: 1, "
        "orderingPolicyRef: round-robin-fairness-policy}]}\n"
    )


def test_holdback_threshold_for_sheddable_requests():
    gate = "featureGates: [flowControl]\n"
    cfg = load(
        gate + "plugins:\n- {type: static-usage-limit-policy, parameters: "
        "{sheddableThreshold: 0.75}}\n"
        "flowControl: {usageLimitPolicyPluginRef: static-usage-limit-policy}\n"
    ).flow_control
    assert (cfg.ceiling, cfg.sheddable_ceiling) == (1.0, 0.75)
    by_type = load(
        gate + "flowControl: {usageLimitPolicyPluginRef: static-usage-limit-policy}\n"
    ).flow_control
    assert (by_type.ceiling, by_type.sheddable_ceiling) == (1.0, 1.0)  # 0 = the threshold
    assert "sheddableThreshold (0.9) must be at most threshold (0.8)" in error(
        "plugins:\n- {type: static-usage-limit-policy, parameters: "
        "{threshold: 0.8, sheddableThreshold: 0.9}}\n"
    )


def test_gate_alone_gives_the_defaults_and_no_gate_is_off():
    cfg = load("featureGates: [flowControl]\n").flow_control
    assert (cfg.max_requests, cfg.max_bytes, cfg.ttl, cfg.ceiling) == (5000, 2**30, 30.0, 1.0)
    assert load("plugins: []\n").flow_control is None


def test_bad_sections_name_the_field():
    gate = "featureGates: [flowControl]\n"
    assert "flowControl.maxRequest: unknown parameter; did you mean 'maxRequests'" in error(
        gate + "flowControl: {maxRequest: 5}\n"
    )
    assert "flowControl.maxBytes: must be > 0" in error(gate + "flowControl: {maxBytes: 0}\n")
    assert "flowControl.defaultRequestTTL: must be seconds or a duration" in error(
        gate + "flowControl: {defaultRequestTTL: soon}\n"
    )
    assert "priorityBands[0].fairnessPolicyRef: refers to 'fair'" in error(
        gate + "flowControl: {priorityBands: [{priority: 1, fairnessPolicyRef: fair}]}\n"
    )
    assert "is not a fairness policy" in error(
        gate + "flowControl: {priorityBands: [{priority: 1, "
        "fairnessPolicyRef: fcfs-ordering-policy}]}\n"
    )
    assert "priorityBands[1].priority: priority 1 is listed twice" in error(
        gate + "flowControl: {priorityBands: [{priority: 1}, {priority: 1}]}\n"
    )
    assert "priorityBands[0].priority: is required" in error(
        gate + "flowControl: {priorityBands: [{maxRequests: 1}]}\n"
    )


def test_quantities_and_durations():
    assert quantity("1k", "x") == 1000 and quantity("2Mi", "x") == 2 * 2**20
    assert quantity(7, "x") == 7
    assert duration("200ms", "x") == pytest.approx(0.2)
    assert duration(2.5, "x") == 2.5
    with pytest.raises(ConfigError, match="x: must be an integer or a quantity"):
        quantity("lots", "x")
