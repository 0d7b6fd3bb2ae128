"""The fast paths of a scheduling cycle at large pools (issue 13 §6) give exactly what
the plain Python paths give: the same totals bit for bit, the same picks for the same
random draws."""

from __future__ import annotations

import random

import pytest

import plugins.scorers.minmax as minmax
from epp.datastore import Endpoint, EndpointMetrics, EndpointSnapshot
from epp.scheduling import profile
from epp.scheduling.registry import Handle
from epp.scheduling.types import CycleState, ScoredEndpoint, ScoredEndpoints
from plugins.pickers.common import PickerParams
from plugins.pickers.max_score import MaxScorePicker


def snaps(n: int) -> list[EndpointSnapshot]:
    return [
        EndpointSnapshot(Endpoint(f"e{i}", "10.0.0.1", 8000 + i), EndpointMetrics())
        for i in range(n)
    ]


def random_scores(rng: random.Random, n: int) -> list[float]:
    # in range mostly; some out of range (clamped), some exact ties
    pool = [0.0, 1.0, 0.5, -0.25, 1.75]
    return [rng.choice(pool) if rng.random() < 0.3 else rng.random() for _ in range(n)]


@pytest.mark.parametrize("n", [64, 300, 1000])
def test_numpy_weighted_sum_equals_the_python_one(n, monkeypatch):
    rng = random.Random(n)
    weights = [2.0, 2.0, 3.0, 0.5]
    lists = [random_scores(rng, n) for _ in weights]
    vector = None
    for scores, w in zip(lists, weights, strict=True):
        vector = profile._add_weighted(vector, scores, w)
    monkeypatch.setattr(profile, "VECTOR_MIN_ENDPOINTS", 10**9)  # force the Python path
    plain = None
    for scores, w in zip(lists, weights, strict=True):
        plain = profile._add_weighted(plain, scores, w)
    assert not isinstance(vector, list) and isinstance(plain, list)
    assert vector.tolist() == plain  # exact equality, not approx
    # and the clamp happened: element 0 by hand, each score clamped to [0, 1] first
    by_hand = 0.0
    for scores, w in zip(lists, weights, strict=True):
        by_hand += w * min(1.0, max(0.0, scores[0]))
    assert plain[0] == by_hand


@pytest.mark.parametrize("n", [64, 1000])
def test_numpy_min_max_equals_the_python_one(n, monkeypatch):
    rng = random.Random(n)
    values = [rng.randrange(0, 40) for _ in range(n)]
    vector = minmax.min_max_inverted(values)
    monkeypatch.setattr(minmax, "_VECTOR_MIN", 10**9)
    assert minmax.min_max_inverted(values) == vector
    assert minmax.min_max_inverted([3] * n) == [1.0] * n  # all equal → 1.0 (upstream)


def test_max_score_fast_path_picks_what_the_loop_picks():
    eps = snaps(200)
    for seed in range(40):
        rng = random.Random(seed)
        # few distinct values: many ties, so the random draw matters
        scores = [float(rng.randrange(4)) for _ in eps]
        picker = MaxScorePicker("p", PickerParams(), Handle(rng=random.Random(seed)))
        fast = picker.pick(CycleState(), None, ScoredEndpoints(eps, scores)).targets  # type: ignore[arg-type]
        listed = [ScoredEndpoint(e, s) for e, s in zip(eps, scores, strict=True)]
        slow = MaxScorePicker("p", PickerParams(), Handle(rng=random.Random(seed)))
        assert fast == slow.pick(CycleState(), None, listed).targets  # type: ignore[arg-type]
        assert scores[eps.index(fast[0])] == max(scores)


def test_scored_endpoints_is_a_sequence_of_scored_endpoint():
    eps = snaps(3)
    scored = ScoredEndpoints(eps, [0.1, 0.9, 0.5])
    assert len(scored) == 3
    assert scored[1] == ScoredEndpoint(eps[1], 0.9)
    assert list(scored) == [ScoredEndpoint(e, s) for e, s in zip(eps, [0.1, 0.9, 0.5], strict=True)]
    assert scored[1:] == [ScoredEndpoint(eps[1], 0.9), ScoredEndpoint(eps[2], 0.5)]
    with pytest.raises(ValueError, match="3 endpoints but 2 scores"):
        ScoredEndpoints(eps, [0.1, 0.2])
