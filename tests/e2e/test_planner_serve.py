"""`epp serve --planner` as a real process: SIGKILL leaves its replicas running and a
restarted `epp serve` adopts them (same pid) instead of starting new ones; a clean
SIGTERM stops every replica it owns, so nothing is orphaned."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from epp.harness.procs import LogReady, ProcessGroup, free_port, pid_runs, wait_until
from epp.planner.live.connectors.statefile import decode

EPP = [sys.executable, "-m", "epp.cli", "serve", "--host", "127.0.0.1"]


def argv() -> list[str]:
    return [*EPP, "--grpc-port", str(free_port()), "--health-port", str(free_port()),
            "--metrics-port", str(free_port())]  # fmt: skip


def test_kill_and_restart_adopts_then_sigterm_stops_everything(tmp_path):
    statefile = tmp_path / "state.json"
    cfg = tmp_path / "planner.yaml"
    cfg.write_text(
        "mode: load\nmin-endpoint: 1\nadjustment-interval: 30\n"
        f"worker-command: epp sim --port {{port}}\nstatefile: {json.dumps(str(statefile))}\n"
    )
    ready = LogReady(r"planner: (\S+ ready|adopted)")
    with ProcessGroup() as pg:
        try:
            _adopt_then_stop(pg, cfg, statefile, ready)
        finally:  # the replica is no child of ours: if the test failed, kill its group
            for w in decode(statefile.read_text()) if statefile.exists() else []:
                if pid_runs(w.pid):
                    os.killpg(w.pid, signal.SIGKILL)


def _adopt_then_stop(pg: ProcessGroup, cfg: Path, statefile: Path, ready: LogReady) -> None:
    first = pg.start("epp-1", [*argv(), "--planner", str(cfg)], ready=ready, timeout=180)
    [worker] = decode(statefile.read_text())
    assert pid_runs(worker.pid)
    first.popen.send_signal(signal.SIGKILL)  # the EPP alone: no clean-up runs
    first.popen.wait(timeout=10)
    assert pid_runs(worker.pid)  # the replica outlived it

    # ready once it serves (its signal handlers are set): a SIGTERM then drains
    serving = LogReady(r"epp serving ext_proc")
    second = pg.start("epp-2", [*argv(), "--planner", str(cfg)], ready=serving, timeout=180)
    assert f"adopted {worker.name} (pid {worker.pid}" in second.output()
    assert decode(statefile.read_text()) == [worker]  # nothing started twice

    second.popen.send_signal(signal.SIGTERM)
    assert second.popen.wait(timeout=90) == 0
    wait_until(lambda: not pid_runs(worker.pid), "the replica to stop")
    assert decode(statefile.read_text()) == []
