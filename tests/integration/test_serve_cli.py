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
