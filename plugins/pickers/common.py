"""What every picker shares: how many endpoints to return (primary + fallbacks)."""

from __future__ import annotations

from dataclasses import dataclass

from epp.config.params import param
from epp.scheduling.interfaces import Plugin
from epp.scheduling.registry import Handle


@dataclass(frozen=True)
class PickerParams:
    max_num_of_endpoints: int = param(
        1, min=1, doc="endpoints returned: the first is the destination, the rest fallbacks"
    )


class BasePicker(Plugin):
    """How many to pick and the injected random source: the same for every picker."""

    Params = PickerParams

    def __init__(self, name: str, params: PickerParams, handle: Handle) -> None:
        super().__init__(name)
        self.k = params.max_num_of_endpoints
        self.rng = handle.rng
