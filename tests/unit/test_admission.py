"""Saturation detectors, objectives → priority, and 429 shedding of sheddable requests."""

import json
import random
from dataclasses import replace

import pytest

from epp.admission import Admission, Objectives, load_objectives_file, parse_objectives
from epp.config.errors import ConfigError
from epp.config.params import parse_params
from epp.datastore import Datastore, Endpoint, EndpointMetrics
from epp.director import Director
from epp.errors import EppError
from epp.request import new_request, parse_body
from epp.scheduling.registry import PLUGIN_TYPES, Handle
from epp.scheduling.types import CycleState
from tests.helpers import completion, snap

NOW = 100.0


def detector(type_name, params=None):
    spec = PLUGIN_TYPES.lookup(type_name)
    return spec.build(type_name, parse_params(spec.params, params), Handle(clock=lambda: NOW))


def fresh(name, queue=0, kv=0.0, age=0.05, **kw):
    s = snap(name, queue=queue, kv=kv, **kw)
    return replace(s, metrics=replace(s.metrics, update_time=NOW - age))


def req(objective=None):
    headers = {"x-gateway-inference-objective": objective} if objective else {}
    return parse_body(
        new_request(headers, "/v1/completions", "POST"), b'{"model":"m","prompt":"hi"}'
    )


# --- utilization-detector --------------------------------------------------------------


def test_utilization_is_the_mean_of_max_queue_and_kv_ratios():
    d = detector("utilization-detector")
    # a: max(2/5, 0.4/0.8) = 0.5; b: max(10/5, 0) = 2.0 → mean 1.25
    assert d.saturation([fresh("a", queue=2, kv=0.4), fresh("b", queue=10)]) == pytest.approx(1.25)
    # a alone: 0.5 < 1, not saturated
    assert d.saturation([fresh("a", queue=2, kv=0.4)]) == pytest.approx(0.5)


def test_stale_or_unscraped_metrics_count_as_saturated():
    d = detector("utilization-detector")
    assert d.saturation([fresh("a", age=0.5)]) == 1.0  # 500 ms > 200 ms
    assert d.saturation([snap("never")]) == 1.0  # update_time 0: never scraped
    assert d.saturation([]) == 1.0
    lenient = detector("utilization-detector", {"metricsStalenessThreshold": 1.0})
    assert lenient.saturation([fresh("a", age=0.5)]) == 0.0


def test_utilization_filter_keeps_unsaturated_and_fails_open():
    d = detector("utilization-detector", {"headroom": 0.2})
    # thresholds × 1.2: queue < 6, KV < 0.96
    eps = [fresh("a", queue=5), fresh("b", queue=6), fresh("c", kv=0.97), fresh("d", age=1)]
    assert [e.name for e in d.filter(CycleState(), completion(), eps)] == ["a"]
    assert d.filter(CycleState(), completion(), eps[1:]) == eps[1:]  # none passes → all


# --- concurrency-detector --------------------------------------------------------------


def test_concurrency_is_inflight_over_capacity():
    d = detector("concurrency-detector", {"maxConcurrency": 4})
    eps = [replace(snap("a"), inflight_requests=3), replace(snap("b"), inflight_requests=5)]
    assert d.saturation(eps) == pytest.approx(1.0)  # (3 + 5) / (4 · 2)
    assert [e.name for e in d.filter(CycleState(), completion(), eps)] == ["a"]
    tok = detector(
        "concurrency-detector", {"concurrencyMode": "tokens", "maxTokenConcurrency": 1000}
    )
    assert tok.saturation([snap("a", inflight_tokens=500)]) == pytest.approx(0.5)
    assert tok.filter(CycleState(), completion(), [snap("a", inflight_tokens=1000)]) == []


# --- objectives -------------------------------------------------------------------------


def test_objectives_file_both_shapes(tmp_path):
    f = tmp_path / "o.yaml"
    f.write_text("objectives:\n- {name: critical, priority: 100}\n- {name: batch, priority: -1}\n")
    o = load_objectives_file(f)
    assert (o.priority(req("critical")), o.priority(req("batch"))) == (100, -1)
    assert o.priority(req("unknown")) == 0 and o.priority(req()) == 0  # upstream default
    f.write_text(
        "kind: InferenceObjective\nmetadata: {name: chat}\nspec: {priority: 5}\n---\n"
        "kind: InferenceObjective\nmetadata: {name: scrape}\nspec: {priority: -3}\n"
    )
    assert load_objectives_file(f).priorities == {"chat": 5, "scrape": -3}


def test_objectives_errors_name_the_field(tmp_path):
    with pytest.raises(ConfigError, match=r"objectives\[0\].priority: must be an integer"):
        parse_objectives([{"objectives": [{"name": "x", "priority": "high"}]}], "o.yaml")
    with pytest.raises(ConfigError, match="defined twice"):
        parse_objectives([{"objectives": [{"name": "x"}, {"name": "x"}]}], "o.yaml")
    with pytest.raises(ConfigError, match="cannot read objectives file"):
        load_objectives_file(tmp_path / "missing.yaml")


# --- admission through the director -----------------------------------------------------


def director_over(queue: int):
    from epp.config.loader import load_default_config

    clock = [NOW]
    ds = Datastore(clock=lambda: clock[0])
    ds.set_endpoints([Endpoint("a", "10.0.0.1", 8000)])
    ds.update_metrics("a", EndpointMetrics(waiting_queue_size=queue, update_time=NOW))
    cfg = load_default_config(Handle(rng=random.Random(0), clock=lambda: clock[0]))
    objectives = Objectives({"critical": 10, "batch": -1})
    return Director(ds, cfg.scheduler, admission=Admission(cfg.saturation_detector, objectives))


def test_sheddable_gets_429_when_saturated_others_are_routed():
    d = director_over(queue=5)  # 5 / 5 = 1.0: saturated
    with pytest.raises(EppError) as e:
        d.route(req("batch"), None)
    assert e.value.status == 429
    body = json.loads(e.value.body())["error"]
    assert body["type"] == "rate_limit_error" and "sheddable" in body["message"]
    assert d.route(req("critical"), None).destinations == ["10.0.0.1:8000"]
    assert d.route(req(), None).destinations == ["10.0.0.1:8000"]  # priority 0: not shed


def test_sheddable_is_routed_below_saturation():
    d = director_over(queue=4)  # 0.8
    assert d.route(req("batch"), None).destinations == ["10.0.0.1:8000"]


def test_config_names_its_saturation_detector():
    from epp.config.loader import load_config_text

    head = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
    cfg = load_config_text(
        head
        + "plugins:\n- {type: concurrency-detector, name: sat, parameters: {maxConcurrency: 8}}\n"
        "- type: queue-scorer\n- type: max-score-picker\n"
        "schedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: queue-scorer\n"
        "  - pluginRef: max-score-picker\nsaturationDetector: {pluginRef: sat}\n"
    )
    assert cfg.saturation_detector.type_name == "concurrency-detector"
    with pytest.raises(ConfigError, match="not a saturation detector"):
        load_config_text(
            head + "plugins:\n- type: queue-scorer\n- type: max-score-picker\n"
            "saturationDetector: {pluginRef: queue-scorer}\n"
        )
