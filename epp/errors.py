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


@dataclass
class EppError(Exception):
    status: int
    message: str
    code: str = ""
    # The client's API shapes the body: a /v1/messages client reads Anthropic's
    # `{"type": "error", "error": {"type", "message"}}` (set where the path is known).
    anthropic: bool = False

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
