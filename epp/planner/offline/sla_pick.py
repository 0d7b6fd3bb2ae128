"""The SLA a comparison judges on: a product target by default, or picked from the trace.

By default a comparison is judged on a product target (`product_sla`): the SLA an
operator would set, not one derived from the trace. `request_sla` below is the
alternative (`--sla-rule requests`): the tightest SLA the static-peak pool meets.

The judge (epp/planner/offline/outcome.py) rates a policy on the share of *requests*
within both SLAs (>= 99 %) and on
its worst 5-minute window (>= 95 %). The replay's first pick (`static.Sizer.default_sla`)
is an *interval* rule: p90 TTFT and p90 ITL within it in every interval, which lets up
to a tenth of each interval's requests miss, so the static-peak pool itself kept only
94.5-98.6 % of requests within it (docs/BENCHMARKS.md@a73a134 "Against the field"): the
request target was unreachable by construction.

`request_sla` picks the SLA from what the static-peak pool actually served: the
tightest thresholds at which it keeps at least `share` (99 %) of its requests within
both, and at least `window_share` (95 %) in every window of `window_s` (whole report
intervals sliding one at a time, as `outcome._worst_window` judges). Tightest along a
ray: both thresholds are the interval pick's times one factor `k`, so the TTFT:ITL
ratio of the interval pick is kept and "tightest" has one answer. A request meets
`(k*ttft, k*itl)` exactly when its own ratio `max(ttft/ttft0, itl/itl0)` is at most `k`
(a one-token answer has no ITL: its TTFT ratio alone), so the smallest `k` is an order
statistic: the ceil(share x n)-th smallest ratio over the run, and in each window the
ceil(window_share x m)-th smallest of its m; `k` is the largest of these. Each threshold
is then rounded up to two significant digits (a readable number, at most ~10 % looser).

Lost requests count as misses (an infinite ratio) in the whole-run share, as
`outcome.summarize` counts them. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from epp.planner.offline.outcome import WORST_WINDOW_S, Sla
from epp.planner.offline.replay import Served

REQUEST_SHARE = 0.99  # the judge: >= 99 % of requests within both SLAs
WINDOW_SHARE = 0.95  # the judge: >= 95 % in every 5-minute window


def request_sla(
    served: Sequence[Served],
    base: Sla,
    interval_s: float,
    *,
    lost: int = 0,
    share: float = REQUEST_SHARE,
    window_share: float = WINDOW_SHARE,
    window_s: float = WORST_WINDOW_S,
) -> Sla:
    """The tightest `(k*base.ttft_ms, k*base.itl_ms)`, rounded up, that `served` meets
    for `share` of all requests (lost ones missing) and `window_share` in every window."""
    if not interval_s > 0:
        raise ValueError("interval_s must be positive")
    for name, v in (("share", share), ("window_share", window_share)):
        if not 0 < v <= 1:
            raise ValueError(f"{name} must be in (0, 1], got {v}")
    if not served:
        raise ValueError("no served request to pick an SLA from")
    ratios = [ratio(s, base) for s in served]
    k = order_stat(ratios + [math.inf] * lost, share)
    count = max(1, math.ceil((max(s.arrival for s in served) + 1e-9) / interval_s))
    buckets: list[list[float]] = [[] for _ in range(count)]
    for s, r in zip(served, ratios, strict=True):
        buckets[min(count - 1, int(s.arrival // interval_s))].append(r)
    width = max(1, min(count, round(window_s / interval_s)))
    for start in range(count - width + 1):
        window = [r for b in buckets[start : start + width] for r in b]
        if window:
            k = max(k, order_stat(window, window_share))
    if not math.isfinite(k):
        raise ValueError(
            f"the static-peak run lost {lost} of {len(served) + lost} requests: no SLA keeps "
            f"{share:.0%} of them; pick the SLA by interval (--sla-rule intervals) or give one"
        )
    return Sla(round_up(k * base.ttft_ms), round_up(k * base.itl_ms))


def ratio(s: Served, base: Sla) -> float:
    """The smallest factor on `base` at which `s` meets both thresholds."""
    r = s.ttft_ms / base.ttft_ms
    return r if math.isnan(s.itl_ms) else max(r, s.itl_ms / base.itl_ms)


def order_stat(values: Sequence[float], share: float) -> float:
    """The ceil(share x n)-th smallest value: the least bound that `share` of them meet."""
    need = max(1, math.ceil(share * len(values) - 1e-9))
    return sorted(values)[need - 1]


def round_up(x: float) -> float:
    """`x` rounded up to two significant digits (437.2 -> 440, 16.03 -> 17, 0.914 -> 0.92)."""
    if not x > 0:
        raise ValueError(f"a threshold must be positive, got {x}")
    e = math.floor(math.log10(x)) - 1
    step = 10.0**e
    digits = max(0, -e)
    v = round(math.ceil(x / step) * step, digits)
    if v < x:  # x / step rounded down across a step boundary
        v = round(v + step, digits)
    return v


# The product target a comparison is judged on by default: what an operator would write
# in the planner file. Dynamo's SLA planner defaults (`SLAPlannerDefaults` in
# ai-dynamo/dynamo components/src/dynamo/planner/defaults.py: ttft 500 ms, itl 50 ms)
# are what an operator of Dynamo's planner gets without setting them; no preset here has
# a published product target of its own, so every preset gets these.
PRODUCT_SLA_SOURCE = "Dynamo's SLA planner defaults (SLAPlannerDefaults: TTFT 500 ms, ITL 50 ms)"
PRODUCT_SLA = Sla(500.0, 50.0)


def product_sla(ttft_ms: float | None = None, itl_ms: float | None = None) -> Sla:
    """The product target, either threshold overridden (`--ttft` / `--itl`, or the
    planner file's `ttft` / `itl`)."""
    return Sla(
        PRODUCT_SLA.ttft_ms if ttft_ms is None else ttft_ms,
        PRODUCT_SLA.itl_ms if itl_ms is None else itl_ms,
    )
