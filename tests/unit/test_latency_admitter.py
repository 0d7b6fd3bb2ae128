"""`latency-slo-admitter`: upstream's README config loads, and its rules (admit unless a
sheddable request with an SLO finds no endpoint meeting it, idle or cold) hold through
the real scheduler, with a refusal that is a 429 naming its reason."""

import dataclasses

import pytest

from epp.config.loader import load_config_text
from epp.errors import EppError
from epp.request import new_request, parse_body
from epp.scheduling.types import CycleState
from plugins.latency.info import LATENCY_PREDICTION_KEY, LatencyPrediction, LatencyPredictionInfo
from tests.helpers import plugin, snap

# llm-d-router pkg/epp/framework/plugins/requestcontrol/admitter/latencyslo/README.md,
# "Configuration Example", with the header every EndpointPickerConfig has.
UPSTREAM = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
  - type: latency-slo-admitter
    name: latency-admitter
  - type: max-score-picker
schedulingProfiles:
  - name: default
    plugins:
      - pluginRef: latency-admitter
      - pluginRef: max-score-picker
"""

BUSY = dict(running=3, kv=0.5)


def request(priority: int, ttft: str | None = "200") -> object:
    headers = {"x-slo-ttft-ms": ttft} if ttft is not None else {}
    req = parse_body(new_request(headers, "/v1/completions", "POST"), b'{"model":"m","prompt":"x"}')
    req.priority = priority
    return req


def state(ttft_ms: dict[str, float], slo: float | None = 200.0) -> CycleState:
    s = CycleState()
    preds = {k: LatencyPrediction(v, 10.0, True) for k, v in ttft_ms.items()}
    s.write(LATENCY_PREDICTION_KEY, LatencyPredictionInfo(preds, slo, None))
    return s


def admit(req, st, eps):
    return plugin("latency-slo-admitter").admit(st, req, eps)


def test_upstream_readme_config_loads_and_runs_before_the_profiles():
    cfg = load_config_text(UPSTREAM, "upstream.yaml")
    assert [a.type_name for a in cfg.scheduler.admitters] == ["latency-slo-admitter"]
    assert "predicted-latency-producer" in {p.type_name for p in cfg.plugins.values()}
    eps = [snap("a", **BUSY), snap("b", **BUSY)]
    # Refused through the scheduler: the producer predicts for a, b; force a miss by a
    # TTFT SLO of 0.001 ms, which no prediction meets.
    req = request(-1, "0.001")
    with pytest.raises(EppError) as e:
        cfg.scheduler.schedule(req, eps)
    assert e.value.status == 429 and e.value.dropped_reason == "rejected-saturated"
    assert "latency-admitter" in e.value.message
    ok = cfg.scheduler.schedule(request(0, "0.001"), eps)  # priority >= 0: admitted
    assert ok.primary.targets


def test_refuses_only_a_sheddable_request_with_an_slo_nobody_meets():
    eps = [snap("a", **BUSY), snap("b", **BUSY)]
    missing = state({"a": 500, "b": 400})
    assert admit(request(-1), missing, eps) is not None
    assert admit(request(0), missing, eps) is None  # not sheddable
    assert admit(request(-1, ttft=None), missing, eps) is None  # no SLO header
    assert admit(request(-1), state({"a": 500, "b": 150}), eps) is None  # b meets it
    assert admit(request(-1), CycleState(), eps) is None  # no predictions: fail open


def test_an_idle_or_cold_endpoint_admits():
    busy = snap("a", **BUSY)
    missing = state({"a": 500, "b": 400})
    idle = snap("b", running=0, kv=0.5)
    assert admit(request(-1), missing, [busy, idle]) is None
    cold = snap("b", running=3, kv=0.01)
    assert admit(request(-1), missing, [busy, cold]) is None
    # Idle by the scrape but the EPP has just sent it a request: not idle.
    sent = dataclasses.replace(idle, inflight_requests=1)
    assert admit(request(-1), missing, [busy, sent]) is not None
