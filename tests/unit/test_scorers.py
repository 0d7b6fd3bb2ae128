"""Exact scores of each scorer on hand-made endpoint sets."""

import pytest

from epp.scheduling.types import CycleState
from tests.helpers import completion, plugin, snap


def score(type_name, endpoints, params=None, request=None):
    return plugin(type_name, params).score(CycleState(), request or completion(), endpoints)


def test_queue_scorer_is_min_max_inverted():
    eps = [snap("a", queue=0), snap("b", queue=5), snap("c", queue=10)]
    assert score("queue-scorer", eps) == [1.0, 0.5, 0.0]


def test_queue_scorer_all_equal_scores_one():
    assert score("queue-depth-scorer", [snap("a", queue=3), snap("b", queue=3)]) == [1.0, 1.0]


def test_running_requests_scorer_min_max():
    eps = [snap("a", running=4), snap("b", running=2), snap("c", running=6)]
    assert score("running-requests-size-scorer", eps) == [0.5, 1.0, 0.0]


def test_kv_cache_scorer_is_one_minus_usage():
    eps = [snap("a", kv=0.0), snap("b", kv=0.25), snap("c", kv=1.0)]
    assert score("kv-cache-utilization-scorer", eps) == [1.0, 0.75, 0.0]
    assert score("kv-cache-scorer", eps) == [1.0, 0.75, 0.0]  # upstream alias


def test_token_load_scorer_default_threshold():
    eps = [snap("a"), snap("b", inflight_tokens=2_097_152), snap("c", inflight_tokens=10**8)]
    assert score("token-load-scorer", eps) == [1.0, 0.5, 0.0]


def test_token_load_scorer_custom_threshold():
    eps = [snap("a", inflight_tokens=250)]
    assert score("token-load-scorer", eps, {"queueThresholdTokens": 1000}) == [pytest.approx(0.75)]


def test_scorers_handle_empty_lists():
    for t in (
        "queue-scorer",
        "running-requests-size-scorer",
        "kv-cache-scorer",
        "token-load-scorer",
    ):
        assert list(score(t, [])) == []
