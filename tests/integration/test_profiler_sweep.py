"""`epp profile --url` against a real `epp sim` process: a quick sweep over HTTP
(streamed token-id completions, /v1/models, /metrics), then the files it writes.

The sim runs the tiny preset 20x faster than real time, so the measured latencies are
mostly HTTP overhead: nothing here asserts a latency's size, only what follows from
the plan and the server's limits (grid, shapes, Dynamo's x/y arithmetic, KV capacity).
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from epp.harness.procs import LogReady, ProcessGroup, free_port
from epp.planner.profiler.plan import decode_grid, prefill_isl_grid
from epp.planner.profiler.results import DECODE_ARRAYS, PREFILL_ARRAYS


@pytest.fixture(scope="module")
def sim_url():
    with ProcessGroup() as pg:
        argv = [sys.executable, "-m", "epp.cli", "sim", "--preset", "tiny"]
        proc = pg.start(
            "sim", [*argv, "--time-scale", "20", "--port", "0"], ready=LogReady("listening on")
        )
        yield proc.output().split("listening on ")[1].split()[0]


def profile_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "epp.cli", "profile", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_quick_sweep_against_epp_sim(sim_url, tmp_path):
    out = tmp_path / "profile"
    run = profile_cli(
        "--url", sim_url, "--time-scale", "20", "--quick", "--isl", "300", "--osl", "100",
        "--ttft", "100000", "--itl", "100000", "-o", str(out),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "Suggested decode TP:1" in run.stdout
    assert "done" in run.stderr  # the progress bar's last state

    with np.load(out / "selected_prefill_interpolation" / "raw_data.npz") as z:
        p = {k: z[k] for k in z.files}
    assert set(p) == set(PREFILL_ARRAYS)
    # tiny: max_model_len 1024 -> range(100, 512, 103) = 100, 203, 306, 409
    assert p["prefill_isl"].tolist() == prefill_isl_grid(1024, 4) == [100, 203, 306, 409]
    assert np.all(np.isfinite(p["prefill_ttft"])) and np.all(p["prefill_ttft"] > 0)
    np.testing.assert_allclose(
        p["prefill_thpt_per_gpu"], p["prefill_isl"] / p["prefill_ttft"] * 1000
    )

    with np.load(out / "selected_decode_interpolation" / "raw_data.npz") as z:
        d = {k: z[k] for k in z.files}
    assert set(d) == set(DECODE_ARRAYS)
    assert d["max_kv_tokens"].tolist() == [128 * 16]  # num_gpu_blocks x block_size on /metrics
    loads = decode_grid(1024, 2048, 3, 100)  # --quick: 3 ISLs x up to 3 counts, OSL 100
    assert d["y_context_length"].tolist() == [x.isl + 50 for x in loads]
    assert d["x_kv_usage"] == pytest.approx([x.kv_usage(2048) for x in loads])
    assert np.all(d["x_kv_usage"] <= 1.0)
    assert np.all(d["z_itl"] > 0) and np.all(d["z_thpt_per_gpu"] > 0)
    assert (out / "decode_raw_data.json").exists() and (out / "prefill_raw_data.json").exists()
    assert (out / "prefill_performance.png").stat().st_size > 0

    # The server's own histograms were read around every point: the sim exports them.
    sweep = json.loads((out / "summary.json").read_text())["sweep"]
    assert len(sweep["prefill"]) == 4 and len(sweep["decode"]) == len(loads)
    assert all(p["server_ttft_ms"] > 0 for p in sweep["prefill"])
    assert all(p["server_itl_ms"] > 0 for p in sweep["decode"])


def test_unreachable_url_is_one_line_exit_2(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    run = profile_cli("--url", url, "--quick", "-o", str(tmp_path / "o"), "--no-progress")
    assert run.returncode == 2
    lines = [x for x in run.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("epp profile: cannot reach"), run.stderr
