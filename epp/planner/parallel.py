"""A comparison's replays side by side, one process each (I/O: processes; the replays
themselves are pure and independent, `offline.compare.compare`'s `runner`).

Each replay is a closure over the trace and its policy factory, which do not pickle;
so the workers are forked (they inherit the closures) and only each job's index goes
out and its `Result` comes back. A worker's progress lines go to the shared stderr,
each named by its policy. Where fork is not available, or with one worker, the replays
run one after another in this process.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable, Sequence

from epp.planner.offline.compare import Job, Result

_JOBS: Sequence[tuple[str, Job]] = ()  # what forked workers run (set before the fork)
# told (policy, result, CPU seconds) when a replay ends, in the process that ran it
Done = Callable[[str, Result, float], None]
_DONE: Done | None = None


def default_workers() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1


def runner(workers: int, done: Done | None = None):
    """A `compare` runner with up to `workers` processes; `done` hears of each replay's
    end (its CPU time: the replay speed, whatever else loads the machine)."""

    def run_all(jobs: Sequence[tuple[str, Job]]) -> list[Result]:
        global _JOBS, _DONE
        _JOBS, _DONE = jobs, done
        try:
            n = min(workers, len(jobs))
            if n <= 1 or "fork" not in multiprocessing.get_all_start_methods():
                return [_run(i) for i in range(len(jobs))]
            ctx = multiprocessing.get_context("fork")
            with ctx.Pool(processes=n, maxtasksperchild=1) as pool:
                return pool.map(_run, range(len(jobs)), chunksize=1)
        finally:
            _JOBS, _DONE = (), None

    return run_all


def _run(i: int) -> Result:
    name, job = _JOBS[i]
    cpu = time.process_time()
    result = job()
    if _DONE is not None:
        _DONE(name, result, time.process_time() - cpu)
    return result
