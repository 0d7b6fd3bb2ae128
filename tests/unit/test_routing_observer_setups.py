"""bench/routing.py's `NAME-obs` setups: an EPP setup with `--response-path observer`,
named and labelled apart from the in-path one so both run side by side in one invocation."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import routing as routing_module
from bench import routing_matrix

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def routing():
    return routing_module


def test_obs_setups_parse_beside_the_in_path_ones(routing):
    args = routing.parse_args(["--setups", "rr,epp-sticky,epp-sticky-obs,epp-rr-obs"])
    assert args.setups == ["rr", "epp-sticky", "epp-sticky-obs", "epp-rr-obs"]


@pytest.mark.parametrize("bad", ["rr-obs", "epp-nothing-obs", "vr-cache-obs"])
def test_obs_is_only_for_epp_setups(routing, bad, capsys):
    with pytest.raises(SystemExit) as exit_info:
        routing.parse_args(["--setups", bad])
    assert exit_info.value.code == 2
    assert "unknown setups" in capsys.readouterr().err


def test_obs_setups_are_labelled_as_their_base_plus_observer(routing):
    assert routing.label("epp-sticky-obs") == (
        routing.LABELS["epp-sticky"] + ", response observed (envoy-observer.yaml)"
    )
    assert routing.label("rr") == routing.LABELS["rr"]


def test_ttft_ratio_table_divides_each_percentile_by_round_robins():
    matrix = routing_matrix

    def row(setup, p50, p90, p99):
        return dict(scenario="one-prefix", rate=40.0, setup=setup, ttft_p50=p50, ttft_p90=p90,
                    ttft_p99=p99)  # fmt: skip

    rows = [
        row("rr", 0.020, 0.040, 0.080),
        row("epp-sticky", 0.030, 0.050, 0.100),
        row("epp-sticky-obs", 0.020, 0.030, None),  # no p99 (e.g. every request failed)
    ]
    table = matrix.ttft_ratio_table(rows)
    # 0.030 / 0.020 = 1.50, 0.050 / 0.040 = 1.25, 0.100 / 0.080 = 1.25; a missing one: "-"
    assert "| one-prefix | 40 | 1.50 / 1.25 / 1.25 | - |" in table
    assert "| scenario | req/s | epp-sticky | epp-sticky-obs |" in table
