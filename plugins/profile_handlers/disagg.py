"""`disagg-profile-handler`: encode/prefill/decode disaggregation, decode first (llm-d's order).

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

With an encode decider (`deciders: {encode: NAME}`, e.g.
`always-disagg-multimodal-decider`), a step runs between 2 and 3 as in llm-d-router
(`disagg_profile_handler.go`, decode → encode → prefill): when the decider approves, the
encode profile runs and its picks travel in `x-encoder-hosts-ports: ip:port[,ip:port]`,
for the decode-side sidecar to send the request's media there first. An encode profile
that finds nothing leaves the request to encode its media where it is prefilled.

Every completed decision is counted in `inference_extension_disagg_decisions_total`
with `decision_type` = `decode-only` | `prefill-decode` | `encode-decode` |
`encode-prefill-decode` (llm-d's values).

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
from epp.headers import ENCODER_HOSTS_PORTS, PREFILLER_HOST_PORT
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
ENCODE_DECISION_KEY = "disagg-profile-handler/encode"

DECODE_ONLY = "decode-only"
PREFILL_DECODE = "prefill-decode"
ENCODE_DECODE = "encode-decode"
ENCODE_PREFILL_DECODE = "encode-prefill-decode"

DISAGG_DECISIONS = Counter(
    "inference_extension_disagg_decisions",
    "Disaggregation outcomes: decode-only, prefill-decode (remote prefill), encode-decode "
    "(remote encode) or encode-prefill-decode.",
    ["decision_type"],
    registry=REGISTRY,
)
PREFILL_UNAVAILABLE = Counter(
    "inference_extension_disagg_prefill_unavailable",
    "Requests the decider sent to remote prefill whose prefill profile found no endpoint; "
    "they ran decode-only.",
    registry=REGISTRY,
)
for _kind in (DECODE_ONLY, PREFILL_DECODE, ENCODE_DECODE, ENCODE_PREFILL_DECODE):
    DISAGG_DECISIONS.labels(_kind)  # both series exist from the start


@dataclass(frozen=True)
class ProfileNames:
    decode: str | None = param(None, doc="decode profile name (default decode)")
    prefill: str | None = param(None, doc="prefill profile name (default prefill)")
    encode: str | None = param(None, doc="encode profile name (default encode)")


@dataclass(frozen=True)
class DeciderNames:
    prefill: str | None = param(None, doc="plugin name of the P/D decider; none: decode-only")
    encode: str | None = param(
        None, doc="plugin name of the encode decider; none: media is encoded where prefilled"
    )


@dataclass(frozen=True)
class DisaggParams:
    profiles: ProfileNames = param(
        default_factory=ProfileNames,
        doc="{decode, prefill, encode}: profile names (llm-d nested form)",
    )
    deciders: DeciderNames = param(
        default_factory=DeciderNames,
        doc="{prefill: NAME, encode: NAME}: the decider plugins (nested form)",
    )
    decode_profile: str | None = param(None, doc="legacy flat form of profiles.decode")
    prefill_profile: str | None = param(None, doc="legacy flat form of profiles.prefill")
    decider_plugin_name: str | None = param(None, doc="legacy flat form of deciders.prefill")
    encode_profile: str | None = param(None, doc="legacy flat form of profiles.encode")
    encode_decider_plugin_name: str | None = param(None, doc="legacy flat form of deciders.encode")

    def validate(self) -> None:
        nested = [
            f"profiles.{k}"
            for k in ("decode", "prefill", "encode")
            if getattr(self.profiles, k) is not None
        ]
        nested += [
            f"deciders.{k}" for k in ("prefill", "encode") if getattr(self.deciders, k) is not None
        ]
        flat = [
            k
            for k, v in (
                ("decodeProfile", self.decode_profile),
                ("prefillProfile", self.prefill_profile),
                ("deciderPluginName", self.decider_plugin_name),
                ("encodeProfile", self.encode_profile),
                ("encodeDeciderPluginName", self.encode_decider_plugin_name),
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
            ("encode profile", self.encode_name),
            ("encode decider name", self.encode_decider_name),
        ):
            if value is not None and not value:
                raise ValueError(f"the {label} must not be empty")
        names = {"decode": self.decode_name, "prefill": self.prefill_name}
        names["encode"] = self.encode_name
        for a, b in (("decode", "prefill"), ("decode", "encode"), ("prefill", "encode")):
            if names[a] == names[b]:
                raise ValueError(f"the {a} and {b} profiles must differ; both are {names[a]!r}")

    @property
    def decode_name(self) -> str:
        return _first(self.profiles.decode, self.decode_profile, "decode")

    @property
    def prefill_name(self) -> str:
        return _first(self.profiles.prefill, self.prefill_profile, "prefill")

    @property
    def encode_name(self) -> str:
        return _first(self.profiles.encode, self.encode_profile, "encode")

    @property
    def encode_decider_name(self) -> str | None:
        if self.deciders.encode is not None:
            return self.deciders.encode
        return self.encode_decider_plugin_name

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
        self.encode = params.encode_name
        self._handle = handle
        self._decider: PrefillDecider | None = None
        self._encode_decider: PrefillDecider | None = None
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
        decider = self._resolve_decider(self.params.decider_name, "a P/D decider")
        encoder = self._resolve_decider(self.params.encode_decider_name, "an encode decider")
        for stage, d, profile in (
            ("prefill", decider, self.prefill),
            ("encode", encoder, self.encode),
        ):
            if d is not None and profile not in profiles:
                raise ValueError(
                    f"{self!r}: {stage} profile {profile!r} is not defined (decider "
                    f"{d.name!r} needs it). Defined profiles: {', '.join(sorted(profiles))}"
                )
        unused = sorted(set(profiles) - {self.decode, self.prefill, self.encode})
        if unused:
            log.warning("%r never runs profile(s) %s", self, ", ".join(unused))
        self._decider = decider
        self._encode_decider = encoder
        self._checked = True

    def _resolve_decider(self, name: str | None, what: str) -> PrefillDecider | None:
        if name is None:
            return None
        plugins = self._handle.plugins
        plugin = plugins.get(name)
        deciders = sorted(n for n, p in plugins.items() if isinstance(p, PrefillDecider))
        if plugin is None:
            raise ValueError(
                f"{self!r}: decider {name!r} is not defined under 'plugins'. Defined deciders: "
                f"{', '.join(deciders) or 'none'} (types prefix-based-pd-decider, "
                "always-disagg-pd-decider, always-disagg-multimodal-decider)"
            )
        if not isinstance(plugin, PrefillDecider):
            raise ValueError(
                f"{self!r}: plugin {plugin!r} is not {what}. Defined deciders: "
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
        if self._encode_decider is not None and ENCODE_DECISION_KEY not in state:
            encode = self._encode_decider.disaggregate(state, request, decode.targets[0])
            state.write(ENCODE_DECISION_KEY, encode)
            if encode:
                return {self.encode: profiles[self.encode]}
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
        encode = results.get(self.encode)
        if encode is not None and encode.targets:
            out[self.encode] = encode
            headers[ENCODER_HOSTS_PORTS] = ",".join(t.hostport for t in encode.targets)
        DISAGG_DECISIONS.labels(
            _decision(ENCODER_HOSTS_PORTS in headers, PREFILLER_HOST_PORT in headers)
        ).inc()
        return SchedulingResult(out, primary_profile=self.decode, headers=headers)


def _decision(encoded: bool, prefilled: bool) -> str:
    if encoded:
        return ENCODE_PREFILL_DECODE if prefilled else ENCODE_DECODE
    return PREFILL_DECODE if prefilled else DECODE_ONLY
