"""A comparison's replays side by side, one process each (I/O: processes; the replays
themselves are pure and independent, `offline.compare.compare`'s `runner`).

Each replay is a closure over the trace and its policy factory, which do not pickle;
so the workers are forked (they inherit the closures) and only each job's index goes
out and its `Result` comes back. A worker's progress lines go to the shared stderr,
each named by its policy. Fork copies only the calling thread, with every lock as it
was: in a process that runs other threads a worker can wait forever on a lock one of
them held. So where fork is not available, the process runs other Python threads (a
test runner, an embedding program), or with one worker, the replays run one after another
in this process; `epp plan replay` itself runs one Python thread.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from epp.planner.offline.compare import Job, Result

_JOBS: Sequence[tuple[str, Job]] = ()  # what forked workers run (set before the fork)
# told (policy, result, CPU seconds) when a replay ends, in the process that ran it
Done = Callable[[str, Result, float], None]
_DONE: Done | None = None
# what a worker sends back of each result (all of it when None): set before the fork
_KEEP: Callable[[Result], Result] | None = None


def default_workers() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1


def runner(workers: int, done: Done | None = None, keep: Callable[[Result], Result] | None = None):
    """A `compare` runner with up to `workers` processes; `done` hears of each replay's
    end (its CPU time: the replay speed, whatever else loads the machine); `keep`, when
    given, is what of each result comes back (`compare.summary_only` for `epp plan
    replay`, whose policies' and swept settings' day-long per-request records would
    otherwise all be held at once)."""

    def run_all(jobs: Sequence[tuple[str, Job]]) -> list[Result]:
        global _JOBS, _DONE, _KEEP
        _JOBS, _DONE, _KEEP = jobs, done, keep
        try:
            n = min(workers, len(jobs))
            if n <= 1 or not fork_is_safe():
                return [_run(i) for i in range(len(jobs))]
            ctx = multiprocessing.get_context("fork")
            with ctx.Pool(processes=n, maxtasksperchild=1) as pool:
                return pool.map(_run, range(len(jobs)), chunksize=1)
        finally:
            _JOBS, _DONE, _KEEP = (), None, None

    return run_all


def fork_is_safe() -> bool:
    """Fork is available and this process runs no other thread that could hold a lock:
    no other Python thread (a server or a scraper left by a test) and no native runtime
    thread (ZeroMQ's I/O and reaper threads, gRPC's C core: `threading` does not count
    them, and a forked worker can wait forever on a lock one of them held at the fork).
    Native runtimes name their threads; threads that keep the process's own name (the
    numeric libraries' worker pools, which are fork-aware) do not count."""
    return (
        "fork" in multiprocessing.get_all_start_methods()
        and threading.active_count() == 1
        and not _named_native_threads()
    )


def _named_native_threads() -> list[str]:
    """The names of this process's threads that differ from its main thread's (Linux
    /proc; elsewhere none are seen, and the `threading` check stands alone)."""
    tasks = Path("/proc/self/task")
    try:
        names = [(tasks / t / "comm").read_text().strip() for t in os.listdir(tasks)]
        main = (tasks / str(os.getpid()) / "comm").read_text().strip()
    except OSError:
        return []
    return [n for n in names if n != main]


def _run(i: int) -> Result:
    name, job = _JOBS[i]
    cpu = time.process_time()
    result = job()
    if _DONE is not None:
        _DONE(name, result, time.process_time() - cpu)
    return result if _KEEP is None else _KEEP(result)
