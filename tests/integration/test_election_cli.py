"""`epp serve`'s leader-election flags: a flag that cannot work, or would do nothing, is
one line and exit 2 before any port opens (never silently ignored)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

EPP = [sys.executable, "-m", "epp.cli", "serve"]
EPP += ["--grpc-port", "0", "--health-port", "0", "--metrics-port", "0"]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*EPP, *args], capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})}
    )


@pytest.fixture
def planner(tmp_path) -> str:
    path = tmp_path / "planner.yaml"
    path.write_text(
        "mode: load\nworker-command: epp sim --port {port}\n"
        f"statefile: {tmp_path / 'state.json'}\n"
    )
    return str(path)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--leader-election", "lease"], "only the planner is elected; add --planner FILE"),
        (["--leader-lock", "x.lock"], "--leader-lock does nothing without --planner"),
        (["@planner", "--leader-election", "off", "--leader-lock", "x"],
         "with --leader-election off"),
        (["@planner", "--leader-election", "lock-file", "--leader-lease", "l"],
         "--leader-lease does nothing with a lock-file election"),
        (["@planner", "--leader-retry-period", "5", "--leader-renew-deadline", "2"],
         "--leader-retry-period < --leader-renew-deadline < --leader-lease-duration"),
    ],
)  # fmt: skip
def test_bad_election_flags_are_one_line_and_exit_2(planner, args, expected):
    argv = [x for a in args for x in (("--planner", planner) if a == "@planner" else (a,))]
    r = run(*argv)
    assert r.returncode == 2, r.stderr
    [line] = r.stderr.strip().splitlines()
    assert line.startswith("epp serve: ") and expected in line


def test_a_lease_without_cluster_credentials_is_one_line(planner, tmp_path):
    env = {"KUBECONFIG": str(tmp_path / "missing-kubeconfig"), "KUBERNETES_SERVICE_HOST": ""}
    r = run("--planner", planner, "--leader-election", "lease", env=env)
    assert r.returncode == 2, r.stderr
    [line] = r.stderr.strip().splitlines()
    assert line.startswith("epp serve: ") and "kubeconfig" in line
