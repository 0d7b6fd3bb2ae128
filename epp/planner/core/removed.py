"""Planner-file keys this project once had and removed with their code.

Each was an option of the `sla` mode, off by default, that no trace of the training
set (the shared one-hour traces, the generated bursty trace, ServeGen days 0-6) chose:
kept, it would be a setting an operator could turn on with nothing to say it helps. A
file that still names one fails at load with one line naming the key, saying it was
removed and what to do instead, rather than "unknown setting" (which reads as a typo)
or a silent ignore (which would change the sizing the operator thinks they asked for).
"""

from __future__ import annotations

from collections.abc import Iterable

from epp.config.errors import ConfigError

_WITH_DEFAULTS = "the mode sizes as with it off (the default); delete the key"

# key -> what it did and what to do instead (docs/planner.md, "Removed options")
REMOVED: dict[str, str] = {
    "distribution-aware-prefill": (
        "removed: sizing prefill over the sampled prompt lengths lost to the mean's on "
        f"Azure and Mooncake; {_WITH_DEFAULTS}"
    ),
    "prefill-interference": (
        "removed: charging decode steps for the prompts batched into them cost more "
        f"GPU-hours than it bought on Azure x3, Mooncake and bursty; {_WITH_DEFAULTS}"
    ),
    "aggregated-ttft": (
        "removed: the step model of an aggregated replica's TTFT bought no attainment "
        f"on the training traces; {_WITH_DEFAULTS}"
    ),
    "max-num-batched-tokens": (
        "removed with aggregated-ttft, the only sizing that read it; delete the key (the "
        "engine's own --max-num-batched-tokens is unaffected)"
    ),
    "request-target": (
        "removed: sizing on the model's share of requests within both SLAs spent more "
        "GPU-hours than static-peak at its 99 % bar; delete the key, and use `epp plan "
        "replay` on your traffic to choose ttft/itl and startup-time"
    ),
    "sla-margin": (
        "removed: attainment-target sizes for the share of requests within the SLA, which "
        "a margin on the percentile only approximated; delete the key"
    ),
    "burst-floor-half-life": f"removed: no training trace chose it; {_WITH_DEFAULTS}",
    "emergency-scale-up": f"removed: no training trace chose it; {_WITH_DEFAULTS}",
    "correction-fast-rise": f"removed: no training trace chose it; {_WITH_DEFAULTS}",
}


def check_removed(keys: Iterable[object]) -> None:
    """Raise for the first removed key among `keys` (one line: the key, then why)."""
    for key in keys:
        why = REMOVED.get(str(key))
        if why is not None:
            raise ConfigError(str(key), why)
