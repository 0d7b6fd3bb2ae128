"""What every picker shares: how many endpoints to return (primary + fallbacks)."""

from __future__ import annotations

from dataclasses import dataclass

from epp.config.params import param


@dataclass(frozen=True)
class PickerParams:
    max_num_of_endpoints: int = param(
        1, min=1, doc="endpoints returned: the first is the destination, the rest fallbacks"
    )
