"""`epp plan replay --compare` replays its policies in parallel processes: the results
are the ones replaying them one after another gives, in the same order, and each
replay's end is reported from the process that ran it."""

from __future__ import annotations

import os

from epp.planner import parallel
from epp.planner.offline import compare as cmp
from epp.planner.offline.outcome import Sla
from tests.unit.test_planner_replay import Script, poisson, shape


def test_parallel_replays_equal_sequential_ones(tmp_path):
    arrivals = poisson(300, 30.0, seed=8)
    setup = cmp.prepare(arrivals, shape(), 5.0, Sla(50.0, 2.5))
    factories = {
        "load": lambda: Script([1, 3, 2], interval_s=5.0, name="a"),
        "epp": lambda: Script([2, 1, 3], interval_s=5.0, name="b"),
    }
    marks = tmp_path / "done"
    marks.mkdir()

    def done(name, result, cpu_s):
        (marks / f"{name}-{os.getpid()}").write_text(str(len(result.run.served)))

    one = cmp.compare(arrivals, setup, factories)
    two = cmp.compare(arrivals, setup, factories, runner=parallel.runner(2, done))
    # repr: a summary holds NaNs (no drain yet), and an unpickled NaN is another object
    assert [repr(r.summary) for r in one] == [repr(r.summary) for r in two]
    assert [repr(r.run) for r in one] == [repr(r.run) for r in two]
    assert [r.summary.policy for r in two] == ["static-peak", "static-mean", "a", "b"]
    seen = sorted(p.name.rsplit("-", 1) for p in marks.iterdir())
    assert [name for name, _ in seen] == ["epp", "load", "static-mean", "static-peak"]
    assert all(int(pid) != os.getpid() for _, pid in seen)  # each ran in a worker
