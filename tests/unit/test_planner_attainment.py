"""An interval's requests against the SLA (`attainment.Tally`), which the SLA mode's
`startup_bound` signal reads; and the keys of the removed attainment feedback, which
a planner file may still carry, fail with one line naming the key.

SLA 400 ms TTFT / 16 ms ITL.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from epp.config.errors import ConfigError
from epp.planner.core.attainment import Tally
from epp.planner.core.config import load_planner_file
from epp.planner.core.types import Observation

TTFT, ITL = 400.0, 16.0


def test_a_tally_counts_requests_within_both_and_one_token_answers_on_ttft_alone():
    o = Observation(
        0,
        60,
        ttft_ms_samples=(100, 500, 100, 100, 450),
        itl_ms_by_request=(10, 10, 20, math.nan, 30),
    )
    t = Tally.of(o, TTFT, ITL)
    assert (t.requests, t.met) == (5, 2)
    assert t.share == pytest.approx(0.4)
    # without the aligned ITLs (an older producer) the requests are judged on TTFT alone
    assert Tally.of(dataclasses.replace(o, itl_ms_by_request=()), TTFT, ITL).met == 3
    assert math.isnan(Tally.of(Observation(0, 60), TTFT, ITL).share)


@pytest.mark.parametrize(
    "key", ["sla-margin", "attainment-target", "attainment-window", "attainment-gain",
            "attainment-max-factor"],
)  # fmt: skip
def test_a_removed_key_fails_with_one_line_naming_it(key):
    with pytest.raises(ConfigError) as e:
        load_planner_file(f"{key}: 0.9\n", "planner.yaml")
    text = str(e.value)
    assert key in text and "removed" in text and "planner.yaml" in text
    assert "\n" not in text and "did you mean" not in text
