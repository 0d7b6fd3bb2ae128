"""bench/planner_heldout.py: the comparisons of each start-up delay merged into the one
document the results table is built from."""

from __future__ import annotations

from bench.planner_frontier import checked, rows_of
from bench.planner_heldout import appended, combined, merge, with_reused


def pol(name: str, gpu_hours: float, share: float = 0.995) -> dict:
    return {
        "name": name, "gpu_hours": gpu_hours, "sla_requests": share,
        "worst_5min_requests": 0.97, "lost": 0, "reversals": 0, "intervals_over_budget": 0,
        "initial_replicas": 2, "gpu_hours_vs_static_peak": None, "gpu_hours_vs_oracle": None,
    }  # fmt: skip


def test_static_peak_and_the_oracle_fill_every_delay_and_the_ratios_follow_them():
    # Start-up 100: static-peak 100 GPU-h, epp 60. Start-up 300: the oracle 50, epp 70
    # (static-peak not replayed again). Each delay's table has both baselines, and epp's
    # ratios are against them: 0.6x / 1.2x at 100 s, 0.7x / 1.4x at 300 s.
    first = {"trace": "t", "last_arrival_s": 3600.0, "startup_s": 100.0,
             "policies": [pol("static-peak", 100.0), pol("epp", 60.0, 0.989)]}  # fmt: skip
    later = {"trace": "t", "last_arrival_s": 3600.0, "startup_s": 300.0,
             "policies": [pol("oracle", 50.0), pol("epp", 70.0)]}  # fmt: skip
    doc = merge([first, later])
    rows, checks = rows_of(doc)
    got = {(r[1], r[2]): (r[4], r[5], r[6]) for r in rows}
    assert got[(100.0, "epp")] == (60.0, 0.6, 1.2)
    assert got[(300.0, "epp")] == (70.0, 0.7, 1.4)
    assert got[(100.0, "oracle")] == (50.0, 0.5, 1.0)
    assert got[(300.0, "static-peak")] == (100.0, 1.0, 2.0)
    assert "requests 98.90% (MISSED)" in checks[0] and "requests 99.50% (met)" in checks[1]


def test_append_keeps_the_other_scales_rows_and_replaces_a_rerun_row():
    # The file holds scale 0.015's rise; the run adds scale 0.075's rise and re-measures
    # 0.015's epp row: that row is replaced in place of a duplicate, the rest kept, the
    # commands joined once each, the notes one paragraph after the other.
    old = {
        "command": "python a --scale 0.015",
        "notes": "Small pools.",
        "rows": [["x0.015", 100.0, "static-peak", 1], ["x0.015", 100.0, "epp", 2]],
    }
    new = [["x0.015", 100.0, "epp", 3], ["x0.075", 100.0, "epp", 4]]
    rows, command, notes = appended(old, new, "python a --scale 0.075", "Ten replicas.")
    assert rows == [["x0.015", 100.0, "static-peak", 1], *new]
    assert command == "python a --scale 0.015 && python a --scale 0.075"
    assert notes == "Small pools.\n\nTen replicas."
    again = appended({**old, "command": command}, new, "python a --scale 0.075", "")
    assert again[1] == command and again[2] == "Small pools."


def test_reuse_takes_the_laws_and_their_frontier_and_epp_is_judged_against_it():
    # The reused comparison swept llm-d-slo: its documented band kept 99.9 % at 150
    # GPU-h, a looser one 99.1 % at 80. This run replayed static-peak (100) and epp (60,
    # 99.5 %). The table has llm-d-slo's row with its cheapest >= 99 % point (80), and
    # epp is 60 / 80 = 0.75x that point: met (<= 0.9x). Without the sweep there is no
    # field point to judge epp against.
    def point(setting: str, gpu_hours: float, share: float, documented: bool) -> dict:
        return {
            "policy": "llm-d-slo", "setting": setting, "gpu_hours": gpu_hours,
            "sla_requests": share, "worst_5min_requests": 0.9, "documented": documented,
        }  # fmt: skip

    cheap = point("band 0.85/0.7", 80.0, 0.991, False)
    sweep = {"startup_s": 100.0, "target": 0.99, "policies": {"llm-d-slo": {
        "points": [point("band 0.55/0.4", 150.0, 0.999, True), cheap],
        "frontier": ["band 0.85/0.7", "band 0.55/0.4"], "cheapest_at_target": cheap}}}  # fmt: skip
    old = {"trace": "t", "last_arrival_s": 3600.0, "startup_s": 100.0, "sweep": [sweep],
           "policies": [pol("static-peak", 100.0), pol("llm-d-slo", 150.0, 0.999),
                        pol("epp", 90.0)]}  # fmt: skip
    doc = {"trace": "t", "last_arrival_s": 3600.0, "startup_s": 100.0,
           "policies": [pol("static-peak", 100.0), pol("epp", 60.0)]}  # fmt: skip
    rows, checks = rows_of(merge([with_reused(doc, old)]))
    got = {r[2]: r for r in rows}
    assert set(got) == {"static-peak", "epp", "llm-d-slo"}
    assert got["epp"][4] == 60.0  # this run's epp, not the reused one
    assert got["llm-d-slo"][3] == "band 0.55/0.4" and got["llm-d-slo"][12:] == [
        80.0,
        "band 0.85/0.7",
    ]
    assert "0.75x the cheapest field point at >= 99 % (met" in checks[0]
    assert checked(checks[0]) == "- t, start-up 100 s"  # what --append replaces it by


def test_append_replaces_the_target_check_of_a_slice_checked_again():
    # The file's notes check the rise at 100 s and 300 s; this run checks the rise at
    # 100 s again (its laws now swept): the old 100 s line goes, the 300 s line and the
    # prose stay, and the new line follows.
    old = {
        "command": "python a",
        "rows": [],
        "notes": "Prose, epp: not a check.\n\n- rise, start-up 100 s, epp: old 100\n"
        "- rise, start-up 300 s, epp: old 300",
    }
    _, _, notes = appended(old, [], "python b", "- rise, start-up 100 s, epp: new 100")
    assert notes == (
        "Prose, epp: not a check.\n\n- rise, start-up 300 s, epp: old 300\n\n"
        "- rise, start-up 100 s, epp: new 100"
    )


def test_reuse_of_two_tags_takes_each_policy_and_frontier_from_the_first_that_has_it():
    # The field run swept llm-d-slo and has no oracle; the earlier run has the oracle
    # (and its own static-peak and epp). Together: the field run's static-peak and
    # llm-d-slo with its frontier, the earlier run's oracle, each once.
    frontier = {"points": [], "frontier": [], "cheapest_at_target": None}
    field = {"startup_s": 100.0, "policies": [pol("static-peak", 100.0), pol("llm-d-slo", 150.0)],
             "sweep": [{"startup_s": 100.0, "target": 0.99,
                        "policies": {"llm-d-slo": frontier}}]}  # fmt: skip
    earlier = {"startup_s": 100.0, "policies": [pol("static-peak", 90.0), pol("oracle", 50.0),
               pol("epp", 70.0)]}  # fmt: skip
    both = combined([field, earlier])
    assert [(p["name"], p["gpu_hours"]) for p in both["policies"]] == [
        ("static-peak", 100.0),
        ("llm-d-slo", 150.0),
        ("oracle", 50.0),
        ("epp", 70.0),
    ]
    assert both["sweep"] == field["sweep"]
    assert "sweep" not in combined([earlier])
