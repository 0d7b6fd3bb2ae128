"""bench/routing.py's `NAME-obs` setups: an EPP setup with `--response-path observer`,
named and labelled apart from the in-path one so both run side by side in one invocation."""

from __future__ import annotations

from pathlib import Path

import pytest

from epp.harness.bench_cli import load_path

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def routing():
    return load_path(ROOT / "bench" / "routing.py", "routing_observer_under_test")


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
