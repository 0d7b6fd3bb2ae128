"""`epp serve` refuses bad start-up input with one clear line and exit code 2."""

import os
import subprocess
import sys

EPP = [sys.executable, "-m", "epp.cli", "serve"]
EPP += ["--grpc-port", "0", "--health-port", "0", "--metrics-port", "0"]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*EPP, *args], capture_output=True, text=True, timeout=60)


def test_bad_config_names_file_and_field(tmp_path):
    cfg = tmp_path / "epp.yaml"
    cfg.write_text("plugins:\n- type: max-score-picker\n  parameters: {maxEndpoints: 2}\n")
    r = run("--config", str(cfg))
    assert r.returncode == 2
    assert f"{cfg}: plugins[0].parameters.maxEndpoints: unknown parameter" in r.stderr
    assert "maxNumOfEndpoints" in r.stderr
    assert "Traceback" not in r.stderr


def test_bad_endpoint_flag_is_explained():
    r = run("--endpoint", "a=127.0.0.1:notaport")
    assert r.returncode == 2
    assert "port" in r.stderr and "Traceback" not in r.stderr


def test_missing_endpoints_file_is_explained(tmp_path):
    r = run("--endpoints", str(tmp_path / "missing.yaml"))
    assert r.returncode == 2
    assert "missing.yaml" in r.stderr and "Traceback" not in r.stderr


# ---- --planner ----------------------------------------------------------------


def planner(tmp_path, text: str) -> str:
    path = tmp_path / "planner.yaml"
    path.write_text(text)
    return str(path)


def test_planner_unknown_option_is_one_line(tmp_path):
    path = planner(tmp_path, "mode: load\nadjustment-intervall: 30\n")
    r = run("--planner", path)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"epp serve: {path}: adjustment-intervall: unknown setting; did you mean "
        "'adjustment-interval'? (docs/planner.md lists them)"
    ]


def test_planner_budget_below_the_minimum_is_one_line(tmp_path):
    # aggregated, min-endpoint 3 × 1 GPU = 3 GPUs > max-gpu-budget 2
    path = planner(tmp_path, "mode: load\nmin-endpoint: 3\nmax-gpu-budget: 2\n")
    r = run("--planner", path)
    assert r.returncode == 2
    [line] = r.stderr.strip().splitlines()
    assert line.startswith(f"epp serve: {path}: max-gpu-budget: 2 is below min-endpoint 3")


def test_planner_missing_profile_data_is_one_line(tmp_path):
    path = planner(tmp_path, f"mode: sla\nprofile-results-dir: {tmp_path / 'nope'}\n")
    r = run("--planner", path)
    assert r.returncode == 2
    [line] = r.stderr.strip().splitlines()
    assert f"{path}: profile-results-dir: mode sla needs profile data" in line
    assert "Traceback" not in r.stderr


def test_planner_pd_pool_without_worker_commands_is_one_line(tmp_path):
    path = planner(tmp_path, "mode: load\npool: disaggregated\n")
    r = run("--planner", path)
    assert r.returncode == 2
    assert r.stderr.strip() == (
        f"epp serve: {path}: prefill-worker-command: a disaggregated pool needs "
        "prefill-worker-command (the live planner)"
    )


def test_planner_file_that_cannot_be_read(tmp_path):
    r = run("--planner", str(tmp_path / "missing.yaml"))
    assert r.returncode == 2
    assert "missing.yaml" in r.stderr and "cannot read" in r.stderr


def test_planner_cannot_share_a_watched_endpoints_file(tmp_path):
    path = planner(tmp_path, "mode: load\n")
    pool = tmp_path / "pool.yaml"
    pool.write_text("- {name: a, address: 127.0.0.1, port: 8000}\n")
    r = run("--planner", path, "--endpoints", str(pool))
    assert r.returncode == 2
    assert "--planner adds and removes its own replicas" in r.stderr
    assert "Traceback" not in r.stderr


def test_planner_kubernetes_needs_a_workload_per_role(tmp_path):
    path = planner(tmp_path, "mode: load\nenvironment: kubernetes\naggregated-workload: Pod/x\n")
    r = run("--planner", path)
    assert r.returncode == 2
    assert r.stderr.strip() == (
        f"epp serve: {path}: aggregated-workload: 'Pod/x': expected Kind/name, Kind one of "
        "Deployment, StatefulSet, LeaderWorkerSet"
    )


def test_bad_limit_flags_are_one_line_each():
    cases = {
        ("--max-buffered-bytes", "0"): "epp serve: --max-buffered-bytes must be > 0",
        ("--body-timeout", "-1"): "epp serve: --body-timeout must be > 0",
        ("--max-json-depth", "0"): "epp serve: --max-json-depth must be > 0",
        ("--drain-timeout", "0"): "epp serve: --drain-timeout must be > 0",
        ("--max-request-headers", "5"): "epp serve: --max-request-headers: max_count must be > 7",
        ("--max-buffered-bytes-per-source", "0"): (
            "epp serve: --max-buffered-bytes-per-source must be > 0"
        ),
        ("--min-body-rate", "-1"): "epp serve: --min-body-rate must be >= 0",
        ("--small-body-reserve-bytes", str(1 << 30)): (
            "epp serve: --small-body-reserve-bytes must be below --max-buffered-bytes"
        ),
    }
    for args, line in cases.items():
        r = run(*args, "--endpoint", "a=127.0.0.1:1")
        assert r.returncode == 2, args
        assert r.stderr.strip().startswith(line), (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1


def test_tracing_with_a_bad_environment_is_one_line_naming_the_variable():
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "zipkin"}
    argv = [*EPP, "--tracing", "--endpoint", "a=127.0.0.1:1"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 2
    assert r.stderr.strip().startswith("epp serve: OTEL_TRACES_EXPORTER='zipkin' is not supported")
