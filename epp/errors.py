"""Errors that end a request with an HTTP status and an OpenAI-style JSON body.

One exception type carries the status so every layer (parser, admission, scheduler)
can refuse a request the same way and the ext_proc side turns it into one
ImmediateResponse.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

# OpenAI error "type" per HTTP status, as OpenAI-compatible servers (vLLM) report them.
_ERROR_TYPES = {
    400: "invalid_request_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
    500: "internal_error",
    503: "service_unavailable",
}


# Anthropic's error types per HTTP status (its Messages API "Errors" reference).
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    431: "invalid_request_error",
    500: "api_error",
    503: "overloaded_error",
}

# Why a request was dropped, in llm-d-router's vocabulary (`pkg/common/error/error.go`,
# `RequestDroppedReason`): every 429 and 503 the EPP answers names one in the response
# header `x-llm-d-request-dropped-reason` and in `epp_requests_refused_total{reason}`.
# "rejected-*": the request never reached a model server; "evicted-*": it was running
# and was stopped. `rejected-body-buffer-full` is this project's own (upstream has no
# server-wide body budget).
SATURATED = "rejected-saturated"
NO_ENDPOINTS = "rejected-no-endpoints"
TTL_EXPIRED = "rejected-ttl-expired"
CONTEXT_CANCELLED = "rejected-context-cancelled"
SHUTTING_DOWN = "rejected-shutting-down"
BODY_BUFFER_FULL = "rejected-body-buffer-full"
EVICTED = "evicted"
EVICTED_PRIORITY = "evicted-priority"

# The reason each refusal code implies, so no call site has to repeat it.
_REASON_BY_CODE = {
    "too_many_requests": SATURATED,
    "no_endpoint_available": NO_ENDPOINTS,
    "queue_timeout": TTL_EXPIRED,
    "body_buffer_full": BODY_BUFFER_FULL,
}


@dataclass
class EppError(Exception):
    status: int
    message: str
    code: str = ""
    # The client's API shapes the body: a /v1/messages client reads Anthropic's
    # `{"type": "error", "error": {"type", "message"}}` (set where the path is known).
    anthropic: bool = False
    # The dropped reason (above) for a 429/503; empty: the one its `code` implies.
    reason: str = ""

    @property
    def dropped_reason(self) -> str:
        """The `x-llm-d-request-dropped-reason` value: set for every 429 and 503 (a 503
        of no known cause is `rejected-no-endpoints`, a 429 `rejected-saturated`), empty
        for other statuses."""
        if self.status not in (429, 503):
            return self.reason
        return (
            self.reason
            or _REASON_BY_CODE.get(self.code, "")
            or (SATURATED if self.status == 429 else NO_ENDPOINTS)
        )

    def __str__(self) -> str:
        return f"{self.status}: {self.message}"

    def body(self) -> bytes:
        if self.anthropic:
            kind = _ANTHROPIC_TYPES.get(self.status, "api_error")
            return json.dumps(
                {"type": "error", "error": {"type": kind, "message": self.message}}
            ).encode()
        return json.dumps(
            {
                "error": {
                    "message": self.message,
                    "type": _ERROR_TYPES.get(self.status, "error"),
                    "param": None,
                    "code": self.code or self.status,
                }
            }
        ).encode()


def bad_request(message: str) -> EppError:
    return EppError(400, message, "bad_request")


def not_found(message: str) -> EppError:
    return EppError(404, message, "model_not_found")


def too_large(message: str) -> EppError:
    return EppError(413, message, "request_too_large")


def timed_out(message: str) -> EppError:
    return EppError(408, message, "request_timeout")


def unavailable(message: str) -> EppError:
    return EppError(503, message, "no_endpoint_available")


def internal_error(message: str) -> EppError:
    """A fault in the EPP itself (a plugin raised, returned nonsense): 500 for this one
    request. The client sees `message`; the cause (with traceback) goes to the EPP log."""
    return EppError(500, message, "internal_error")


def plugin_failed(plugin: object, problem: str) -> EppError:
    return internal_error(f"endpoint picker plugin {plugin!r} failed: {problem}")
