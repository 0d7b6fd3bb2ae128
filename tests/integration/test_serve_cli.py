"""`epp serve` refuses bad start-up input with one clear line and exit code 2."""

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


def test_bad_limit_flags_are_one_line_each():
    cases = {
        ("--max-buffered-bytes", "0"): "epp serve: --max-buffered-bytes must be > 0",
        ("--body-timeout", "-1"): "epp serve: --body-timeout must be > 0",
        ("--max-json-depth", "0"): "epp serve: --max-json-depth must be > 0",
        ("--drain-timeout", "0"): "epp serve: --drain-timeout must be > 0",
        ("--max-request-headers", "5"): "epp serve: --max-request-headers: max_count must be > 7",
    }
    for args, line in cases.items():
        r = run(*args, "--endpoint", "a=127.0.0.1:1")
        assert r.returncode == 2, args
        assert r.stderr.strip().startswith(line), (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1
