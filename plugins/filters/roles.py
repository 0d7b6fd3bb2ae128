"""Role filters for encode/prefill/decode pools, on label `llm-d.ai/role` (llm-d's values).

`decode-endpoints-filter` also keeps unlabelled endpoints (an aggregated server decodes);
`prefill-endpoints-filter` does not. `both` is llm-d's deprecated spelling of
`prefill-decode`.
"""

from __future__ import annotations

from epp.config.params import NoParams
from epp.datastore import EndpointSnapshot
from epp.request import InferenceRequest
from epp.scheduling.interfaces import Plugin
from epp.scheduling.registry import Handle, register
from epp.scheduling.types import CycleState

PREFILL_ROLES = frozenset(
    {"prefill", "prefill-decode", "both", "encode-prefill", "encode-prefill-decode"}
)
DECODE_ROLES = frozenset({"decode", "prefill-decode", "both", "encode-prefill-decode"})
# llm-d-router `filter/bylabel/roles.go`: encode is the first stage (E -> P -> D).
ENCODE_ROLES = frozenset({"encode", "encode-prefill", "encode-prefill-decode"})


class _RoleFilter(Plugin):
    roles: frozenset[str] = frozenset()
    keep_unlabelled = False

    def __init__(self, name: str, params: NoParams, handle: Handle) -> None:
        super().__init__(name)

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: list[EndpointSnapshot]
    ) -> list[EndpointSnapshot]:
        out = []
        for e in endpoints:
            role = e.endpoint.role
            if role in self.roles or (role is None and self.keep_unlabelled):
                out.append(e)
        return out


@register("prefill-endpoints-filter", aliases=("prefill-filter",))
class PrefillEndpointsFilter(_RoleFilter):
    roles = PREFILL_ROLES


@register("decode-endpoints-filter", aliases=("decode-filter",))
class DecodeEndpointsFilter(_RoleFilter):
    roles = DECODE_ROLES
    keep_unlabelled = True


@register("encode-filter")
class EncodeEndpointsFilter(_RoleFilter):
    roles = ENCODE_ROLES
