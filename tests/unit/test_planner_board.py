"""The virtual connector's decision-id rules on a made-up clock (reference §6.1)."""

from epp.planner.live.connectors.board import DecisionBoard, Outcome, Published


def test_first_decision_is_id_0_and_unchanged_counts_publish_nothing():
    b = DecisionBoard()
    assert b.update(0.0, 1, 2) is Outcome.PUBLISHED
    assert b.current == Published(1, 2, 0)
    b.complete(0)
    assert b.update(10.0, 1, 2) is Outcome.UNCHANGED
    assert b.current.decision_id == 0


def test_a_new_decision_waits_for_completion_then_proceeds_after_1800_s():
    b = DecisionBoard()
    b.update(0.0, 1, 1)  # id 0, not completed
    assert b.update(100.0, 2, 1) is Outcome.SKIPPED  # first skip at 100
    assert b.update(1899.0, 3, 1) is Outcome.SKIPPED  # 1799 s since the first skip
    assert b.update(1900.0, 3, 1) is Outcome.PUBLISHED  # 1800 s: proceed anyway
    assert b.current == Published(3, 1, 1)


def test_completion_unblocks_and_the_skip_clock_restarts():
    b = DecisionBoard()
    b.update(0.0, 1, 1)
    assert b.update(5.0, 2, 1) is Outcome.SKIPPED
    assert b.complete(0) == 0 and b.completed == Published(1, 1, 0)
    assert b.update(6.0, 2, 1) is Outcome.PUBLISHED  # id 1
    assert b.update(7.0, 3, 1) is Outcome.SKIPPED  # a fresh first skip at 7
    assert b.update(1806.0, 3, 1) is Outcome.SKIPPED  # 1799 s after 7
    assert b.update(1807.0, 3, 1) is Outcome.PUBLISHED


def test_completing_an_unknown_or_old_id_changes_nothing():
    b = DecisionBoard()
    assert b.complete(0) == -1  # nothing published yet
    b.update(0.0, 1, 1)
    b.complete(0)
    b.update(1.0, 2, 2)  # id 1
    assert b.complete(5) == 0  # not published
    assert b.complete(-1) == 0
    assert b.completed == Published(1, 1, 0)
