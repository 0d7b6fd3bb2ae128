"""bench/planner_heldout_field.py: a comparison's sweep turned into rows, each law's
cheapest point at >= 99 %, and `epp`'s ratio to the cheapest of them recomputed from
the held-out table."""

from __future__ import annotations

from bench.planner_heldout_field import (
    CHEAPEST,
    FRONTIER,
    RATIO,
    epp_rows,
    merge_parts,
    merged,
    notes_with,
    summary_lines,
    sweep_rows,
)

TRACE = "ServeGen m-small h172-184 x0.015"


def point(policy: str, setting: str, gpu_h: float, share: float, documented=False) -> dict:
    return {"policy": policy, "setting": setting, "gpu_hours": gpu_h, "sla_requests": share,
            "worst_5min_requests": 0.9, "documented": documented}  # fmt: skip


def law(points: list[dict], frontier: list[str], cheapest: dict | None) -> dict:
    return {"points": points, "frontier": frontier, "cheapest_at_target": cheapest}


def comparison() -> dict:
    """static-peak 100 GPU-h at 99.4 %; keda-queue reaches 99 % only at target 0.5 (120
    GPU-h); llm-d-slo at band 0.7/0.55 (90 GPU-h, its documented band 180); load never."""
    keda = [
        point("keda-queue", "target 5", 60, 0.80, True),
        point("keda-queue", "target 1", 90, 0.97),
        point("keda-queue", "target 0.5", 120, 0.995),
    ]
    llmd = [point("llm-d-slo", "band 0.55/0.4", 180, 0.990, True),
            point("llm-d-slo", "band 0.7/0.55", 90, 0.991)]  # fmt: skip
    load = [point("load", "profiler", 50, 0.7, True), point("load", "kv 0.3/0.1", 70, 0.9)]
    return {
        "startup_s": 100.0,
        "policies": [
            {
                "name": "static-peak",
                "initial_replicas": 2,
                "gpu_hours": 100.0,
                "sla_requests": 0.994,
                "worst_5min_requests": 0.93,
            }
        ],
        "sweep": [
            {
                "startup_s": 100.0,
                "target": 0.99,
                "policies": {
                    "static-peak": law(
                        [point("static-peak", "default", 100, 0.994)], ["default"], None
                    ),
                    "keda-queue": law(keda, ["target 5", "target 1", "target 0.5"], keda[2]),
                    "llm-d-slo": law(llmd, ["band 0.7/0.55"], llmd[1]),
                    "load": law(load, ["profiler", "kv 0.3/0.1"], None),
                },
            }
        ],
        "refused": {"dynamo": "upstream refuses an aggregated pool"},
    }


def heldout(epp_gpu_h: float) -> dict:
    cols = ["trace", "startup_s", "policy", "setting", "gpu_hours", "vs_static_peak",
            "requests_within_sla", "worst_5min"]  # fmt: skip
    return {"columns": cols, "rows": [
        [TRACE, 100.0, "static-peak", "", 100.0, 1.0, 0.994, 0.93],
        [TRACE, 100.0, "epp", "", epp_gpu_h, epp_gpu_h / 100, 0.99, 0.86],
        [TRACE, 300.0, "epp", "", 70.0, 0.7, 0.99, 0.76],  # no field sweep at 300 s here
    ]}  # fmt: skip


def test_rows_mark_the_frontier_and_each_laws_cheapest_point():
    rows = sweep_rows(comparison(), TRACE)
    by = {(r[2], r[3]): r for r in rows}
    assert by[("static-peak", "2 replicas")][4] == 100.0
    assert by[("keda-queue", "target 0.5")][CHEAPEST] is True
    assert by[("llm-d-slo", "band 0.7/0.55")][CHEAPEST] is True
    assert by[("llm-d-slo", "band 0.55/0.4 (documented)")][FRONTIER] is False
    assert by[("llm-d-slo", "band 0.55/0.4 (documented)")][5] == 1.8  # x static-peak
    assert not any(r[CHEAPEST] for r in rows if r[2] == "load")
    assert rows[-1][2] == "dynamo" and rows[-1][3].startswith("not run: upstream refuses")


def test_epps_ratio_is_to_the_cheapest_field_point_and_recomputes_from_the_tables():
    field = sweep_rows(comparison(), TRACE)
    (row,) = epp_rows(field, heldout(60.0))  # only the delay the field was swept at
    assert row[RATIO] == round(60.0 / 90.0, 4)  # llm-d-slo's 90, not keda-queue's 120
    (again,) = epp_rows(field, heldout(85.5))  # the held-out table re-measured
    assert again[RATIO] == 0.95
    lines = summary_lines(merged(field, [again]))
    assert "`load` never reaches 99 % (2 settings; best 90.00% at kv 0.3/0.1" in lines[0]
    assert "`llm-d-slo` 90.0 GPU-h (0.90x static-peak) at band 0.7/0.55" in lines[0]
    assert "= 0.95x the cheapest (MISSED: <= 0.9x)" in lines[0]
    notes = notes_with("Set-up.", merged(field, [again]))
    assert notes.startswith("Set-up.\n\n**Per slice") and notes.endswith(lines[0])


def test_the_parts_of_a_comparison_merge_into_it():
    # the comparison split as the script runs it: static-peak and keda-queue (with
    # dynamo's refusal), then llm-d-slo, then load, each with its own sweep
    whole = comparison()
    laws = whole["sweep"][0]["policies"]

    def part(names: list[str], policies: list[dict], refused: dict) -> dict:
        sweep = whole["sweep"][0] | {"policies": {n: laws[n] for n in names}}
        return {"startup_s": 100.0, "policies": policies, "sweep": [sweep], "refused": refused}

    parts = [
        part(["static-peak", "keda-queue"], whole["policies"], whole["refused"]),
        part(["llm-d-slo"], [], {}),
        part(["load"], [], {}),
    ]
    assert sweep_rows(merge_parts(parts), TRACE) == sweep_rows(whole, TRACE)


def test_a_comparison_without_static_peak_takes_it_from_another_delay():
    whole = comparison()
    later = {"startup_s": 300.0, "policies": [], "sweep": whole["sweep"]}
    rows = sweep_rows(merge_parts([later], whole["policies"]), TRACE)
    assert rows[0][:5] == [TRACE, 300.0, "static-peak", "2 replicas", 100.0]
    assert all(r[1] == 300.0 for r in rows)
