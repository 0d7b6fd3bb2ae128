"""The profile's weighted sum, filter short-circuit and the scheduler's loop."""

from collections.abc import Sequence

import pytest

from epp.errors import EppError
from epp.scheduling.profile import SchedulerProfile, WeightedScorer
from epp.scheduling.scheduler import Scheduler
from epp.scheduling.types import CycleState, ProfileResult, ScoredEndpoint
from tests.helpers import completion, plugin, snap


class FixedScorer:
    type_name = "fixed"

    def __init__(self, name: str, scores: Sequence[float]) -> None:
        self.name = name
        self.scores = scores

    def score(self, state, request, endpoints):
        return self.scores[: len(endpoints)]


class RecordingPicker:
    type_name = "recording"
    name = "recording"

    def __init__(self) -> None:
        self.seen: list[ScoredEndpoint] = []

    def pick(self, state, request, scored):
        self.seen = scored
        return ProfileResult([max(scored, key=lambda s: s.score).endpoint])


class DropAll:
    type_name = "drop-all"
    name = "drop-all"

    def filter(self, state, request, endpoints):
        return []


def test_final_score_is_weighted_sum():
    picker = RecordingPicker()
    profile = SchedulerProfile(
        "p",
        [],
        [
            WeightedScorer(FixedScorer("A", [0.8]), 2.0),
            WeightedScorer(FixedScorer("B", [0.5]), 1.0),
        ],
        picker,
    )
    profile.run(CycleState(), completion(), [snap("x")])
    assert picker.seen[0].score == pytest.approx(2.1)


def test_scores_are_clamped_to_unit_interval():
    picker = RecordingPicker()
    profile = SchedulerProfile(
        "p", [], [WeightedScorer(FixedScorer("A", [1.7, -0.4]), 1.0)], picker
    )
    profile.run(CycleState(), completion(), [snap("x"), snap("y")])
    assert [s.score for s in picker.seen] == [1.0, 0.0]


def test_filter_that_removes_everything_ends_profile_without_result():
    picker = RecordingPicker()
    profile = SchedulerProfile("p", [DropAll()], [], picker)
    assert profile.run(CycleState(), completion(), [snap("x")]) is None
    assert picker.seen == []


def test_scheduler_with_single_handler_picks_least_loaded():
    profile = SchedulerProfile(
        "default",
        [],
        [
            WeightedScorer(plugin("queue-scorer"), 2.0),
            WeightedScorer(plugin("kv-cache-scorer"), 2.0),
        ],
        plugin("max-score-picker"),
    )
    sched = Scheduler(plugin("single-profile-handler"), {"default": profile})
    eps = [
        snap("busy", queue=9, kv=0.9),
        snap("idle", queue=0, kv=0.1),
        snap("mid", queue=3, kv=0.5),
    ]
    result = sched.schedule(completion(), eps)
    assert result.primary_profile == "default"
    assert [t.name for t in result.targets] == ["idle"]


def test_scheduler_raises_503_when_profile_finds_nothing():
    profile = SchedulerProfile("default", [DropAll()], [], plugin("max-score-picker"))
    sched = Scheduler(plugin("single-profile-handler"), {"default": profile})
    with pytest.raises(EppError) as e:
        sched.schedule(completion(), [snap("x")])
    assert e.value.status == 503


def test_scheduler_refuses_empty_candidate_list():
    profile = SchedulerProfile("default", [], [], plugin("max-score-picker"))
    sched = Scheduler(plugin("single-profile-handler"), {"default": profile})
    with pytest.raises(EppError) as e:
        sched.schedule(completion(), [])
    assert e.value.status == 503


class CountingProducer:
    type_name = "counting-producer"
    name = "counting-producer"
    produces = "name-lengths"

    def produce(self, state, request, endpoints):
        return {e.name: len(e.name) for e in endpoints}


class ReadsProducer:
    type_name = "reads-producer"
    name = "reads-producer"

    def score(self, state, request, endpoints):
        data = state.read("name-lengths")
        return [data[e.name] / 10 for e in endpoints]


def test_producers_run_before_profiles_and_results_carry_cycle_state():
    profile = SchedulerProfile(
        "default", [], [WeightedScorer(ReadsProducer(), 1.0)], plugin("max-score-picker")
    )
    sched = Scheduler(plugin("single-profile-handler"), {"default": profile}, [CountingProducer()])
    result = sched.schedule(completion(), [snap("a"), snap("bbbb"), snap("cc")])
    assert [t.name for t in result.targets] == ["bbbb"]
    assert result.cycle_state.read("name-lengths") == {"a": 1, "bbbb": 4, "cc": 2}
