"""The field's documented set-ups and `--compare --sweep`'s frontiers."""

from __future__ import annotations

import json

import pytest

from epp.cli import main
from epp.planner.offline.laws.catalog import (
    KEDA_TARGETS,
    LLMD_BANDS,
    law_sweeps,
    llmd_slo,
)
from epp.planner.offline.laws.llmd_slo import law
from epp.planner.offline.outcome import Sla
from epp.planner.offline.pool import PoolShape
from epp.planner.offline.sweep import Point, cheapest_at, frontier, frontier_lines, sweep_json
from epp.planner.profiler.results import decode_kv_bounds, prefill_queue_bounds
from epp.sim import presets
from tests.unit.test_planner_fleet import tiny_trace

SLA = Sla(500.0, 50.0)


def test_llm_d_slo_is_set_up_as_its_guide_says():
    """Band 0.55/0.40, minReplicaCount 3 (the guide's benchmark bounds 3-8), at most
    the budget; a budget below 3 replicas lowers the floor to it."""
    p = llmd_slo(SLA, 12)().params
    assert (p.theta_up, p.theta_down, p.clamp) == (0.55, 0.40, 2.0)
    assert (p.min_replicas, p.max_replicas) == (3, 12)
    assert (p.ttft_slo_ms, p.tpot_slo_ms) == (500.0, 50.0)
    assert llmd_slo(SLA, 2)().params.min_replicas == 2
    # a swept band keeps the guide's clamp until it would not exceed theta_up
    assert llmd_slo(SLA, 12, (1.3, 1.15))().params.clamp == 2.6


def test_the_law_at_a_swept_band_by_hand():
    # n 4 all ready, s 0.84 above 0.70: 4 + ceil(4 x (0.84/0.70 - 1)) = 4 + ceil(0.8) = 5
    assert law(4, 4, 0.84, 0.70, 0.55) == 5
    # inside the band 0.55..0.70: hold
    assert law(4, 4, 0.60, 0.70, 0.55) == 4
    # below 0.55: 10 - floor(10 x (1 - 0.33/0.55)) = 10 - floor(4.0) = 6
    assert law(10, 10, 0.33, 0.70, 0.55) == 6
    # the guide's band, 2 of 4 ready: credit 0.5, 4 + ceil(4 x (1.1 x 0.5/0.55 - 1)) = 4
    assert law(4, 2, 1.1, 0.55, 0.40) == 4


def test_the_sweeps_cover_each_laws_knob_documented_first():
    shape = PoolShape(presets.config_for("tiny"))
    sweeps = law_sweeps(["llm-d-slo", "keda-queue", "oracle"], sla=SLA, shape=shape, budget_gpus=8)
    assert set(sweeps) == {"llm-d-slo", "keda-queue"}
    assert [s for s, _ in sweeps["keda-queue"]] == [f"target {t:g}" for t in KEDA_TARGETS]
    assert KEDA_TARGETS[0] == 5.0 and all(t <= 5 for t in KEDA_TARGETS)
    targets = [f().params.target for _, f in sweeps["keda-queue"]]
    assert targets == list(KEDA_TARGETS)
    bands = [(f().params.theta_up, f().params.theta_down) for _, f in sweeps["llm-d-slo"]]
    assert bands == list(LLMD_BANDS) and bands[0] == (0.55, 0.40)
    assert all(round(u - d, 9) == 0.15 for u, d in bands)  # the guide's band width kept
    assert all(f().params.max_replicas == 8 for _, f in sweeps["llm-d-slo"])


def test_the_load_thresholds_follow_the_profilers_formulas_by_hand():
    # 4 requests of (1000 + 200/2) tokens in a 442,368-token cache: util 0.00995;
    # up = util + 0.2, down = max(0.1, util - 0.2)
    b = decode_kv_bounds(4, 1000, 200, 442_368)
    assert b.upper == pytest.approx(0.20995, abs=1e-5) and b.lower == 0.1
    # TTFT 500 ms SLA, 100 ms measured: up 500 x 1.2/100 - 1 = 5, down 500 x 0.8/100 - 1 = 3
    q = prefill_queue_bounds(500.0, 100.0)
    assert (q.upper, q.lower) == pytest.approx((5.0, 3.0))


def pt(policy, setting, gpu_h, share, documented=False):
    return Point(policy, setting, gpu_h, share, share, documented)


def test_the_frontier_of_a_scripted_sweep():
    pts = [
        pt("keda-queue", "target 5", 10.0, 0.95, True),
        pt("keda-queue", "target 3", 12.0, 0.985),
        pt("keda-queue", "target 2", 11.0, 0.990),  # beats target 3 on both axes
        pt("keda-queue", "target 1", 15.0, 0.996),
        pt("keda-queue", "target 0.5", 15.0, 0.996),  # equal to target 1: dropped
        pt("keda-queue", "target 0.25", 16.0, 0.990),  # dominated by target 2
    ]
    assert [p.setting for p in frontier(pts)] == ["target 5", "target 2", "target 1"]
    assert cheapest_at(pts).setting == "target 2"
    assert cheapest_at(pts, 0.999) is None
    doc = sweep_json(pts)
    keda = doc["policies"]["keda-queue"]
    assert keda["frontier"] == ["target 5", "target 2", "target 1"]
    assert keda["cheapest_at_target"]["setting"] == "target 2"
    lines = frontier_lines([*pts, pt("llm-d-slo", "band 0.55/0.4", 20.0, 0.97, True)])
    assert lines[0].startswith("frontier keda-queue") and "target 5*" in lines[0]
    assert any("llm-d-slo" in ln and "none of 1 settings" in ln for ln in lines)


def test_compare_sweep_replays_each_setting_and_dynamo_is_refused(tmp_path, capsys):
    trace = tiny_trace(tmp_path, n=200)
    out = tmp_path / "s.json"
    args = ["plan", "replay", "--trace", str(trace), "--compare", "--quiet", "--sweep",
            "--policies", "static-peak,keda-queue,dynamo", "--preset", "tiny",
            "--interval", "2", "--startup-s", "1", "--jobs", "1", "--json", str(out)]  # fmt: skip
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "dynamo       not run: upstream Dynamo's aggregated planner refuses" in text
    assert "frontier keda-queue" in text
    doc = json.loads(out.read_text())
    assert "dynamo" in doc["refused"]
    keda = doc["sweep"][0]["policies"]["keda-queue"]
    assert [p["setting"] for p in keda["points"]] == [f"target {t:g}" for t in KEDA_TARGETS]
    assert [p["documented"] for p in keda["points"]] == [True] + [False] * 4


def test_sweep_without_compare_is_one_line_and_exit_2(tmp_path, capsys):
    trace = tiny_trace(tmp_path, n=20)
    code = main(["plan", "replay", "--trace", str(trace), "--sweep", "--preset", "tiny"])
    assert code == 2
    assert "--sweep sweeps the laws of a comparison" in capsys.readouterr().err


def test_the_pareto_plot_draws_each_swept_laws_frontier():
    # keda-queue: (4, 90 %) is beaten by (3, 95 %), so its frontier is the other two
    # points; llm-d-slo has one point, drawn as a dot with no line
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from epp.planner.plots import _draw_frontiers

    pts = [
        Point("keda-queue", "target 5", 4.0, 0.90, 0.5, documented=True),
        Point("keda-queue", "target 1", 3.0, 0.95, 0.8),
        Point("keda-queue", "target 0.5", 6.0, 0.995, 0.97),
        Point("llm-d-slo", "band 0.55/0.4", 8.0, 0.999, 0.99, documented=True),
    ]
    fig, ax = plt.subplots()
    names = ["static-peak"]
    _draw_frontiers(ax, pts, names)
    lines = [(list(line.get_xdata()), list(line.get_ydata())) for line in ax.lines]
    assert ([3.0, 6.0], [95.0, 99.5]) in lines  # keda-queue's frontier
    assert ([0, 1], [99.0, 99.0]) in lines  # the 99 % bar
    assert len(lines) == 2 and names == ["static-peak", "keda-queue", "llm-d-slo"]
    assert sum(len(c.get_offsets()) for c in ax.collections) == 4  # every point a dot
    plt.close(fig)
