"""`epp plan replay --compare` replays its policies in parallel processes: the results
are the ones replaying them one after another gives, in the same order, and each
replay's end is reported from the process that ran it. Forking is safe only in a
process with one thread, so the parallel run happens in a fresh interpreter (the test
runner has threads of its own, where the runner falls back to one process)."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from epp.planner import parallel
from tests.eventually import eventually_sync

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import os, sys
from epp.planner import parallel
from epp.planner.offline import compare as cmp
from epp.planner.offline.outcome import Sla
from tests.unit.test_planner_replay import Script, poisson, shape

assert parallel.fork_is_safe()
arrivals = poisson(300, 30.0, seed=8)
setup = cmp.prepare(arrivals, shape(), 5.0, Sla(50.0, 2.5))
factories = {
    "load": lambda: Script([1, 3, 2], interval_s=5.0, name="a"),
    "epp": lambda: Script([2, 1, 3], interval_s=5.0, name="b"),
}
me = os.getpid()

def done(name, result, cpu_s):
    print(f"done {name} {os.getpid() != me}", flush=True)

one = cmp.compare(arrivals, setup, factories)
two = cmp.compare(arrivals, setup, factories, runner=parallel.runner(2, done))
# repr: a summary holds NaNs, and an unpickled NaN is another object
print("same", [repr(r.summary) for r in one] == [repr(r.summary) for r in two])
print("runs", [repr(r.run) for r in one] == [repr(r.run) for r in two])
print("order", ",".join(r.summary.policy for r in two))
slim = cmp.compare(arrivals, setup, factories, runner=parallel.runner(2, None, cmp.summary_only))
print("slim same", [repr(r.summary) for r in one] == [repr(r.summary) for r in slim])
print("slim records", sum(len(r.run.served) + len(r.run.decisions) for r in slim))
"""


def test_parallel_replays_equal_sequential_ones():
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "same True" in lines and "runs True" in lines
    assert "order static-peak,static-mean,a,b" in lines
    # a sweep keeps the summaries alone: the records stay in the worker that made them
    assert "slim same True" in lines and "slim records 0" in lines
    done = sorted(line for line in lines if line.startswith("done"))
    assert done == [f"done {n} True" for n in ("epp", "load", "static-mean", "static-peak")]


def test_a_process_with_threads_replays_in_itself():
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert not parallel.fork_is_safe()
        ran = parallel.runner(2)([("x", lambda: "one"), ("y", lambda: "two")])
        assert ran == ["one", "two"]
    finally:
        stop.set()
        t.join()


def test_a_process_with_a_native_runtime_thread_replays_in_itself():
    """ZeroMQ's I/O threads are invisible to `threading` but can hold a lock at the fork
    (a forked worker once hung the test runner this way): they keep the replays in one
    process too."""
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.SUB)
    try:
        sock.bind("tcp://127.0.0.1:0")
        eventually_sync(
            lambda: any(n.startswith("ZMQbg") for n in parallel._named_native_threads()),
            "ZeroMQ's I/O threads to start",
        )
        assert not parallel.fork_is_safe()
        ran = parallel.runner(2)([("x", lambda: "one"), ("y", lambda: "two")])
        assert ran == ["one", "two"]
    finally:
        sock.close(linger=0)
        ctx.term()
