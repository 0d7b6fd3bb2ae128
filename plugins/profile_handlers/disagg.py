"""`disagg-profile-handler`: prefill/decode disaggregation, decode first (llm-d's order).

1. Run the decode profile. No decode endpoint → 503, as llm-d ("failed to find
   available decode workers").
2. Ask the decider (a plugin named in the parameters) whether this request needs a
   remote prefill *given the chosen decode endpoint* (what it already caches matters).
   No decider configured → every request is decode-only.
3. If so, run the prefill profile. Its first pick travels to the decode-side sidecar in
   `x-prefiller-host-port: ip:port`; the decode endpoint stays the destination. When the
   prefill profile finds nothing the request falls back to decode-only (counted in
   `inference_extension_disagg_prefill_unavailable_total`); a prefill pick that is the
   decode endpoint itself (a `prefill-decode` server) is decode-only too, since sending
   a server its own prefill only adds a hop.

Every completed decision is counted in `inference_extension_disagg_decisions_total`
with `decision_type` = `decode-only` | `prefill-decode`.

Parameters accept llm-d's nested form (`profiles: {decode, prefill}`, `deciders:
{prefill}`) and its legacy flat form (`decodeProfile`, `prefillProfile`,
`deciderPluginName`); mixing the two is an error, as in llm-d since strict decoding.
The ext_proc side removes any client-sent `x-prefiller-host-port` before this header is
set, so a client cannot choose the prefill server.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client import Counter

from epp.config.params import param
from epp.errors import EppError, unavailable
from epp.headers import PREFILLER_HOST_PORT
from epp.observability import REGISTRY
from epp.request import InferenceRequest
from epp.scheduling.interfaces import Plugin
from epp.scheduling.profile import SchedulerProfile
from epp.scheduling.registry import Handle, register
from epp.scheduling.types import CycleState, ProfileResult, SchedulingResult
from plugins.deciders.base import PrefillDecider

log = logging.getLogger("epp.plugins.disagg")

# The header the decode-side sidecar reads (llm-d's name; see epp/sidecar/).
# CycleState keys: the decider's verdict, and the decode pick published before the
# prefill profile runs so prefill-side plugins may use it (as llm-d does).
DECISION_KEY = "disagg-profile-handler/remote-prefill"
DECODE_ENDPOINT_KEY = "disagg-profile-handler/decode-endpoint"

DECODE_ONLY = "decode-only"
PREFILL_DECODE = "prefill-decode"

DISAGG_DECISIONS = Counter(
    "inference_extension_disagg_decisions",
    "P/D scheduling outcomes: decode-only or prefill-decode (remote prefill).",
    ["decision_type"],
    registry=REGISTRY,
)
PREFILL_UNAVAILABLE = Counter(
    "inference_extension_disagg_prefill_unavailable",
    "Requests the decider sent to remote prefill whose prefill profile found no endpoint; "
    "they ran decode-only.",
    registry=REGISTRY,
)
for _kind in (DECODE_ONLY, PREFILL_DECODE):
    DISAGG_DECISIONS.labels(_kind)  # both series exist from the start


@dataclass(frozen=True)
class ProfileNames:
    decode: str | None = param(None, doc="decode profile name (default decode)")
    prefill: str | None = param(None, doc="prefill profile name (default prefill)")


@dataclass(frozen=True)
class DeciderNames:
    prefill: str | None = param(None, doc="plugin name of the P/D decider; none: decode-only")


@dataclass(frozen=True)
class DisaggParams:
    profiles: ProfileNames = param(
        default_factory=ProfileNames, doc="{decode, prefill}: profile names (llm-d nested form)"
    )
    deciders: DeciderNames = param(
        default_factory=DeciderNames, doc="{prefill: NAME}: the decider plugin (nested form)"
    )
    decode_profile: str | None = param(None, doc="legacy flat form of profiles.decode")
    prefill_profile: str | None = param(None, doc="legacy flat form of profiles.prefill")
    decider_plugin_name: str | None = param(None, doc="legacy flat form of deciders.prefill")

    def validate(self) -> None:
        nested = [
            f"profiles.{k}" for k in ("decode", "prefill") if getattr(self.profiles, k) is not None
        ]
        if self.deciders.prefill is not None:
            nested.append("deciders.prefill")
        flat = [
            k
            for k, v in (
                ("decodeProfile", self.decode_profile),
                ("prefillProfile", self.prefill_profile),
                ("deciderPluginName", self.decider_plugin_name),
            )
            if v is not None
        ]
        if nested and flat:
            raise ValueError(
                f"mixes the nested form ({', '.join(nested)}) with the legacy flat form "
                f"({', '.join(flat)}); use one of them"
            )
        for label, value in (
            ("decode profile", self.decode_name),
            ("prefill profile", self.prefill_name),
            ("decider name", self.decider_name),
        ):
            if value is not None and not value:
                raise ValueError(f"the {label} must not be empty")
        if self.decode_name == self.prefill_name:
            raise ValueError(
                f"the decode and prefill profiles must differ; both are {self.decode_name!r}"
            )

    @property
    def decode_name(self) -> str:
        return _first(self.profiles.decode, self.decode_profile, "decode")

    @property
    def prefill_name(self) -> str:
        return _first(self.profiles.prefill, self.prefill_profile, "prefill")

    @property
    def decider_name(self) -> str | None:
        if self.deciders.prefill is not None:
            return self.deciders.prefill
        return self.decider_plugin_name


def _first(*values: str | None) -> str:
    return next(v for v in values if v is not None)


@register("disagg-profile-handler")
class DisaggProfileHandler(Plugin):
    Params = DisaggParams

    def __init__(self, name: str, params: DisaggParams, handle: Handle) -> None:
        super().__init__(name)
        self.params = params
        self.decode = params.decode_name
        self.prefill = params.prefill_name
        self._handle = handle
        self._decider: PrefillDecider | None = None
        self._checked = False

    # ---- validation ---------------------------------------------------------
    def validate_profiles(self, profiles: Mapping[str, SchedulerProfile]) -> None:
        """Check the profile and decider names against the loaded config.

        Raises ValueError naming the missing name and what is defined. The config loader
        calls it, so a mistyped name stops `epp serve` at start; the first request checks
        again for handlers built outside a config (tests).
        """
        if self.decode not in profiles:
            raise ValueError(
                f"{self!r}: decode profile {self.decode!r} is not defined. Defined profiles: "
                f"{', '.join(sorted(profiles)) or 'none'}"
            )
        decider = self._resolve_decider()
        if decider is not None and self.prefill not in profiles:
            raise ValueError(
                f"{self!r}: prefill profile {self.prefill!r} is not defined (decider "
                f"{decider.name!r} needs it). Defined profiles: {', '.join(sorted(profiles))}"
            )
        unused = sorted(set(profiles) - {self.decode, self.prefill})
        if unused:
            log.warning("%r never runs profile(s) %s", self, ", ".join(unused))
        self._decider = decider
        self._checked = True

    def _resolve_decider(self) -> PrefillDecider | None:
        name = self.params.decider_name
        if name is None:
            return None
        plugins = self._handle.plugins
        plugin = plugins.get(name)
        deciders = sorted(n for n, p in plugins.items() if isinstance(p, PrefillDecider))
        if plugin is None:
            raise ValueError(
                f"{self!r}: decider {name!r} is not defined under 'plugins'. Defined deciders: "
                f"{', '.join(deciders) or 'none'} (types prefix-based-pd-decider, "
                "always-disagg-pd-decider)"
            )
        if not isinstance(plugin, PrefillDecider):
            raise ValueError(
                f"{self!r}: plugin {plugin!r} is not a P/D decider. Defined deciders: "
                f"{', '.join(deciders) or 'none'}"
            )
        return plugin

    def _ensure_checked(self, profiles: Mapping[str, SchedulerProfile]) -> None:
        if not self._checked:
            try:
                self.validate_profiles(profiles)
            except ValueError as e:
                raise EppError(500, f"invalid P/D configuration: {e}", "config_error") from None

    # ---- scheduling -----------------------------------------------------------
    def pick_profiles(
        self,
        state: CycleState,
        request: InferenceRequest,
        profiles: dict[str, SchedulerProfile],
        results: dict[str, ProfileResult | None],
    ) -> dict[str, SchedulerProfile]:
        self._ensure_checked(profiles)
        if self.decode not in results:
            return {self.decode: profiles[self.decode]}
        decode = results[self.decode]
        if decode is None or self.prefill in results or DECISION_KEY in state:
            return {}
        remote = self._decider is not None and self._decider.disaggregate(
            state, request, decode.targets[0]
        )
        state.write(DECISION_KEY, remote)
        if not remote:
            return {}
        state.write(DECODE_ENDPOINT_KEY, decode.targets[0])
        return {self.prefill: profiles[self.prefill]}

    def process_results(
        self,
        state: CycleState,
        request: InferenceRequest,
        results: dict[str, ProfileResult | None],
    ) -> SchedulingResult:
        decode = results.get(self.decode)
        if decode is None:
            raise unavailable(
                f"profile '{self.decode}' found no decode endpoint that can take this request"
            )
        out: dict[str, ProfileResult | None] = {self.decode: decode}
        headers: dict[str, str] = {}
        prefill = results.get(self.prefill)
        if prefill is not None and prefill.targets[0].hostport != decode.targets[0].hostport:
            out[self.prefill] = prefill
            headers[PREFILLER_HOST_PORT] = prefill.targets[0].hostport
        elif state.read(DECISION_KEY) and prefill is None:
            PREFILL_UNAVAILABLE.inc()
            log.debug("request %s: no prefill endpoint available; decode-only", request.request_id)
        DISAGG_DECISIONS.labels(PREFILL_DECODE if headers else DECODE_ONLY).inc()
        return SchedulingResult(out, primary_profile=self.decode, headers=headers)
