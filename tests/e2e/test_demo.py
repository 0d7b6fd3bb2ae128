"""`epp demo` prints its table and verdict, and leaves no process behind, also on Ctrl-C."""

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.eventually import eventually_sync

pytestmark = pytest.mark.e2e


def processes_with_marker(marker: str) -> list[int]:
    """PIDs whose environment carries `marker` (children inherit it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker.encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def wait_gone(marker: str, timeout: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = processes_with_marker(marker)
        if not left:
            return []
        time.sleep(0.2)
    return processes_with_marker(marker)


def demo_env() -> tuple[dict[str, str], str]:
    marker = f"EPP_TEST_MARK={uuid.uuid4()}"
    env = dict(os.environ)
    env["EPP_TEST_MARK"] = marker.split("=", 1)[1]
    return env, marker.split("=", 1)[1]


def test_demo_prints_table_and_verdict_and_cleans_up():
    env, marker = demo_env()
    r = subprocess.run(
        [sys.executable, "-m", "epp.cli", "demo", "--requests", "40", "--concurrency", "8"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "endpoint   requests" in out
    for name in ("sim-0", "sim-1", "sim-2", "sim-3"):
        assert name in out
    assert "verdict: OK: 40/40 requests succeeded" in out
    assert wait_gone(marker) == []


def test_demo_ctrl_c_stops_every_process():
    env, marker = demo_env()
    p = subprocess.Popen(
        [sys.executable, "-m", "epp.cli", "demo", "--requests", "5000", "--concurrency", "4"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        # Wait until the stack is up and traffic flows, then interrupt.
        deadline = time.monotonic() + 60
        for line in p.stdout:
            if "ready in" in line or time.monotonic() > deadline:
                break
        eventually_sync(  # demo, 4 sims, epp, envoys
            lambda: len(processes_with_marker(marker)) >= 6, "the demo's processes", 60
        )
        p.send_signal(signal.SIGINT)
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130
    assert wait_gone(marker) == []


def test_planner_demo_replays_a_trace_scales_up_then_down_and_ends_with_the_verdict(tmp_path):
    # 80 arrivals over 40 s of trace (2/s), 20 output tokens each; 10× faster: 20/s for
    # 4 s. One demo replica (2 at a time, 8 ms per token: 20 × 8 ms = 0.16 s each) serves
    # at most 2 / 0.16 = 12.5/s, so a queue builds by 7.5/s (≥ 5 waiting within the first
    # 2 s interval: 0.02 × 5 = 0.1, the demo's scale-up threshold) and the planner adds
    # replicas; after the slice there is no traffic, so it drains them back to one
    # (--cooldown bounds only a broken run).
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        "".join(
            f'{{"timestamp": {i * 500}, "input_length": 64, "output_length": 20}}\n'
            for i in range(80)
        )
    )
    env, marker = demo_env()
    argv = [sys.executable, "-m", "epp.cli", "demo", "--planner", "--trace", str(trace),
            "--trace-seconds", "40", "--speedup", "10", "--sample", "1", "--interval", "2",
            "--cooldown", "240", "--png", str(tmp_path / "t.png")]  # fmt: skip
    r = subprocess.run(argv, capture_output=True, text=True, timeout=420, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith("replaying 80 requests (40 s of trace in 4 s)")
    # the timeline: replicas rise during the slice and fall after it
    replicas = [int(x.split()[1]) for x in lines if re.match(r"^ +\d+ +\d+ ", x)]
    peak = max(replicas)
    assert peak >= 2 and replicas[-1] == 1, r.stdout
    assert replicas.index(peak) < len(replicas) - 1 - replicas[::-1].index(1)
    assert lines[-2] == f"replicas: peak {peak}, then down to 1"
    assert lines[-1].startswith("planner demo: 0 failed requests of 80; ")
    assert "GPU-hours vs" in lines[-1]
    assert (tmp_path / "t.png").stat().st_size > 0
    assert wait_gone(marker) == []
