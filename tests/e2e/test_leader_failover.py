"""Two `epp serve --planner` processes sharing one planner file (environment local): the
lock file elects one, whose planner starts the pool's replica; the other only mirrors the
pool (it routes over the same replica). SIGKILL the leader: the follower takes the lock,
adopts the running replica (same pid: nothing started twice) and acts from then on.

"Never two at once": the follower's log has no take-over line before the leader died, and
the statefile never names more replicas than min-endpoint. How long the take-over takes is
timing, measured in bench/leader_failover.py, not asserted here."""

from __future__ import annotations

import json
import os
import signal
import sys
import urllib.request
from pathlib import Path

from epp.harness.procs import LogReady, ProcessGroup, free_port, pid_runs, wait_until
from epp.planner.live.connectors.statefile import decode

EPP = [sys.executable, "-m", "epp.cli", "serve", "--host", "127.0.0.1"]
TAKE_OVER = "leads: taking over"


def endpoints(metrics_port: int) -> list[str]:
    url = f"http://127.0.0.1:{metrics_port}/debug/endpoints"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=5) as r:
        return sorted(e["name"] for e in json.load(r))


def test_the_follower_takes_over_when_the_leader_is_killed(tmp_path):
    statefile = tmp_path / "state.json"
    cfg = tmp_path / "planner.yaml"
    cfg.write_text(
        "mode: load\nmin-endpoint: 1\nadjustment-interval: 30\nmetric-pulling-interval: 0.2\n"
        f"worker-command: epp sim --port {{port}}\nstatefile: {json.dumps(str(statefile))}\n"
    )
    with ProcessGroup() as pg:
        try:
            _failover(pg, cfg, statefile)
        finally:  # the replica is no child of ours: if the test failed, kill its group
            for w in decode(statefile.read_text()) if statefile.exists() else []:
                if pid_runs(w.pid):
                    os.killpg(w.pid, signal.SIGKILL)


def _start(pg: ProcessGroup, name: str, cfg: Path, ready: str) -> tuple[object, int]:
    metrics = free_port()
    argv = [*EPP, "--grpc-port", str(free_port()), "--health-port", str(free_port()),
            "--metrics-port", str(metrics), "--planner", str(cfg),
            "--leader-retry-period", "0.2", "--leader-renew-deadline", "0.5",
            "--leader-lease-duration", "1"]  # fmt: skip
    return pg.start(name, argv, ready=LogReady(ready), timeout=180), metrics


def _failover(pg: ProcessGroup, cfg: Path, statefile: Path) -> None:
    leader, _ = _start(pg, "epp-a", cfg, r"planner: \S+ ready")
    assert "leader election: lock file" in leader.output()
    [worker] = decode(statefile.read_text())
    follower, f_metrics = _start(pg, "epp-b", cfg, r"is a follower")
    # The follower mirrors the leader's pool (its planner ticks every 0.2 s).
    wait_until(lambda: endpoints(f_metrics) == [worker.name], "the follower to see the replica")
    assert TAKE_OVER not in follower.output()
    assert decode(statefile.read_text()) == [worker]  # one replica, started by one planner

    leader.popen.send_signal(signal.SIGKILL)  # no clean-up runs: the kernel drops the lock
    leader.popen.wait(timeout=10)
    wait_until(lambda: TAKE_OVER in follower.output(), "the follower to take over")
    wait_until(lambda: f"adopted {worker.name} (pid {worker.pid}" in follower.output(),
               "the new leader to adopt the replica")  # fmt: skip
    assert decode(statefile.read_text()) == [worker]  # adopted, not started again
    assert endpoints(f_metrics) == [worker.name]

    follower.popen.send_signal(signal.SIGTERM)  # the new leader owns it: a clean exit stops it
    assert follower.popen.wait(timeout=90) == 0
    wait_until(lambda: not pid_runs(worker.pid), "the replica to stop")
