"""`session-affinity-scorer`: the endpoint that served a session's previous request scores 1.

The session id is the request's session key (`epp.session_key`: the agent clients'
session headers in llm-d-router's agent-identity order, then `prompt_cache_key`,
Anthropic `metadata.user_id`, OpenAI `user`, then `x-session-token`, llm-d's header;
`epp serve --session-key-sources` reorders them), or only the header `headerName` when
that is set. The EPP remembers session → endpoint name server-side, learned at
pre-request from the first target of the primary profile (or of `profileName`), as llm-d's
`session_id` strategy does (llm-d-router `pkg/epp/framework/plugins/scheduling/util/
sessionaffinity/session_id.go`); llm-d's other strategy instead sends the pod back to the
client in a response header, which needs a response-header hook this EPP does not have.

Scores: the remembered endpoint 1.0, every other 0.0. No header, an unknown or expired
session, or a remembered endpoint that is not among the candidates (it left the pool, is
unhealthy, or was filtered out) → 0.0 everywhere: equal scores express no preference, and
0 is llm-d's value for that case ("the scorer abstains").

Differences from llm-d, on purpose: the binding always follows the latest request's
endpoint ("the endpoint that served the previous request"; that endpoint holds the
session's newest KV cache), where llm-d moves it only when the bound pod was absent from
the candidates. Expiry is lazy — checked on read, and the oldest entries are dropped as
new ones arrive — instead of llm-d's sweeper goroutine (`evictionSweepSeconds`); and the
number of sessions is bounded (`maxSessions`, least recently used dropped first).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

from epp.config.params import param
from epp.datastore import EndpointSnapshot
from epp.headers import SESSION_TOKEN
from epp.request import InferenceRequest
from epp.scheduling.interfaces import Plugin
from epp.scheduling.registry import Handle, register
from epp.scheduling.types import CycleState, SchedulingResult

MAX_SESSION_ID_CHARS = 128


@dataclass(frozen=True)
class SessionAffinityParams:
    header_name: str = param(
        "",
        doc="read the session id from this header only; empty: the request's session key "
        f"(epp serve --session-key-sources, which ends with {SESSION_TOKEN})",
    )
    eviction_ttl_seconds: float = param(
        300.0, doc="a session unused this long is forgotten (llm-d's default)"
    )
    max_sessions: int = param(
        100_000, min=1, doc="sessions remembered at most; the least recently used goes first"
    )
    profile_name: str = param(
        "", doc="profile whose first target is remembered; empty = the primary profile"
    )

    def validate(self) -> None:
        if self.header_name and not self.header_name.strip():
            raise ValueError("headerName must be a header name, or omitted for the session key")
        if self.eviction_ttl_seconds <= 0:
            raise ValueError(f"evictionTtlSeconds must be > 0, got {self.eviction_ttl_seconds}")


@register("session-affinity-scorer")
class SessionAffinityScorer(Plugin):
    Params = SessionAffinityParams

    def __init__(self, name: str, params: SessionAffinityParams, handle: Handle) -> None:
        super().__init__(name)
        self.header = params.header_name.strip().lower()  # request headers are lower-cased
        self.ttl = params.eviction_ttl_seconds
        self.max_sessions = params.max_sessions
        self.profile_name = params.profile_name
        self.clock = handle.clock
        # session id → (endpoint name, last use); least recently used first, so expired
        # entries collect at the front.
        self._sessions: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def _session_id(self, request: InferenceRequest) -> str:
        """The client's session id; a long one is kept as its hash, so the map's memory
        is bounded by max_sessions × ~128 bytes, not by what clients send."""
        if not self.header:
            return request.session_key or ""
        sid = (request.headers.get(self.header) or "").strip()
        if len(sid) > MAX_SESSION_ID_CHARS:
            return "blake2b:" + hashlib.blake2b(sid.encode("utf-8", "replace")).hexdigest()
        return sid

    def endpoint_for(self, session_id: str) -> str | None:
        """The endpoint remembered for `session_id`, or None if unknown or expired."""
        entry = self._sessions.get(session_id)
        if entry is None:
            return None
        if self.clock() - entry[1] > self.ttl:
            del self._sessions[session_id]
            return None
        return entry[0]

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[EndpointSnapshot]
    ) -> list[float]:
        sid = self._session_id(request)
        target = self.endpoint_for(sid) if sid else None
        if target is None:
            return [0.0] * len(endpoints)
        return [1.0 if e.name == target else 0.0 for e in endpoints]

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        sid = self._session_id(request)
        if not sid:
            return
        picked = result.profile_results.get(self.profile_name or result.primary_profile)
        if picked is None or not picked.targets:
            return
        now = self.clock()
        sessions = self._sessions
        sessions[sid] = (picked.targets[0].name, now)
        sessions.move_to_end(sid)
        while sessions:  # drop expired entries from the least recently used end
            _, (_, last) = next(iter(sessions.items()))
            if now - last <= self.ttl:
                break
            sessions.popitem(last=False)
        while len(sessions) > self.max_sessions:
            sessions.popitem(last=False)
