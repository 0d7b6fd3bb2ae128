"""The drain machine: stop once nothing is in flight, force after the timeout, and never
take a decision back."""

from epp.planner.core.drain import Drain, DrainStep


def test_keeps_while_requests_are_in_flight_then_stops_at_zero():
    d = Drain("w0", started_at=100.0, timeout_s=30.0)
    assert d.advance(101.0, 3) is DrainStep.KEEP
    assert d.advance(120.0, 1) is DrainStep.KEEP  # 20 s < 30 s timeout
    assert d.advance(121.0, 0) is DrainStep.STOP
    assert d.done and d.last_inflight == 0


def test_forces_a_stop_at_the_timeout_with_work_left():
    d = Drain("w0", started_at=100.0, timeout_s=30.0)
    assert d.advance(129.9, 2) is DrainStep.KEEP  # 29.9 s < 30 s
    assert d.advance(130.0, 2) is DrainStep.FORCE_STOP  # 30 s: given up
    assert d.last_inflight == 2


def test_an_idle_endpoint_stops_at_once_even_with_zero_timeout():
    assert Drain("w0", 0.0, 0.0).advance(0.0, 0) is DrainStep.STOP


def test_the_outcome_sticks():
    d = Drain("w0", 0.0, 10.0)
    assert d.advance(1.0, 0) is DrainStep.STOP
    # a request counted late must not resurrect a replica already being stopped
    assert d.advance(2.0, 5) is DrainStep.STOP
    f = Drain("w1", 0.0, 1.0)
    assert f.advance(5.0, 1) is DrainStep.FORCE_STOP
    assert f.advance(6.0, 0) is DrainStep.FORCE_STOP
