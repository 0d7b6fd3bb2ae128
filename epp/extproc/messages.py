"""Building ext_proc v3 ProcessingResponses.

Kept apart from the state machine so the protobuf shapes Envoy expects are in one
place. Header values go in `raw_value` (bytes), as Envoy itself sends them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

from epp.errors import EppError
from epp.headers import (
    DESTINATION_ENDPOINT,
    DESTINATION_SUBSET,
    LB_METADATA_NAMESPACE,
    PREFILLER_HOST_PORT,
    SUBSET_HINT_NAMESPACE,
)

# Routing headers a client must never choose: removed from every request.
CLIENT_FORBIDDEN_HEADERS = (DESTINATION_ENDPOINT, PREFILLER_HOST_PORT)
# Envoy rejects larger streamed body mutations; upstream chunks at this size.
MAX_STREAMED_CHUNK = 62_000

_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


def header_mutation(
    set_headers: Mapping[str, str], remove: Iterable[str] = ()
) -> pb.HeaderMutation:
    return pb.HeaderMutation(
        set_headers=[
            base_pb2.HeaderValueOption(
                header=base_pb2.HeaderValue(key=k, raw_value=v.encode()),
                append_action=_OVERWRITE,
            )
            for k, v in set_headers.items()
        ],
        remove_headers=list(remove),
    )


def destination_metadata(destinations: list[str]) -> struct_pb2.Struct:
    md = struct_pb2.Struct()
    md.fields[LB_METADATA_NAMESPACE].struct_value.fields[
        DESTINATION_ENDPOINT
    ].string_value = ",".join(destinations)
    return md


def headers_response(
    mutation: pb.HeaderMutation,
    clear_route_cache: bool = False,
    metadata: struct_pb2.Struct | None = None,
) -> pb.ProcessingResponse:
    resp = pb.ProcessingResponse(
        request_headers=pb.HeadersResponse(
            response=pb.CommonResponse(
                header_mutation=mutation, clear_route_cache=clear_route_cache
            )
        )
    )
    if metadata is not None:
        resp.dynamic_metadata.CopyFrom(metadata)
    return resp


def streamed_body_responses(
    body: bytes, end_of_stream: bool = True, request: bool = True
) -> list[pb.ProcessingResponse]:
    """The body as streamed_response mutations of at most 62,000 bytes each."""
    chunks = [body[i : i + MAX_STREAMED_CHUNK] for i in range(0, len(body), MAX_STREAMED_CHUNK)]
    if not chunks:
        chunks = [b""]
    out = []
    last = len(chunks) - 1
    for i, chunk in enumerate(chunks):
        common = pb.CommonResponse(
            body_mutation=pb.BodyMutation(
                streamed_response=pb.StreamedBodyResponse(
                    body=chunk, end_of_stream=end_of_stream and i == last
                )
            )
        )
        if request:
            out.append(pb.ProcessingResponse(request_body=pb.BodyResponse(response=common)))
        else:
            out.append(pb.ProcessingResponse(response_body=pb.BodyResponse(response=common)))
    return out


def buffered_body_response(
    mutation: pb.HeaderMutation | None,
    new_body: bytes | None,
    clear_route_cache: bool,
    metadata: struct_pb2.Struct | None,
) -> pb.ProcessingResponse:
    common = pb.CommonResponse(clear_route_cache=clear_route_cache)
    if mutation is not None:
        common.header_mutation.CopyFrom(mutation)
    if new_body is not None:
        common.body_mutation.body = new_body
    resp = pb.ProcessingResponse(request_body=pb.BodyResponse(response=common))
    if metadata is not None:
        resp.dynamic_metadata.CopyFrom(metadata)
    return resp


def empty_request_body_response() -> pb.ProcessingResponse:
    return pb.ProcessingResponse(request_body=pb.BodyResponse())


def immediate_response(error: EppError) -> pb.ProcessingResponse:
    return pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=error.status),  # type: ignore[arg-type]
            headers=header_mutation({"content-type": "application/json"}),
            body=error.body(),
            details=f"epp_{error.code or error.status}",
        )
    )


def request_trailers_response() -> pb.ProcessingResponse:
    return pb.ProcessingResponse(request_trailers=pb.TrailersResponse())


def response_headers_passthrough() -> pb.ProcessingResponse:
    return pb.ProcessingResponse(response_headers=pb.HeadersResponse())


def response_body_passthrough(body: pb.HttpBody, streamed: bool) -> list[pb.ProcessingResponse]:
    """The same bytes back (FULL_DUPLEX_STREAMED: Envoy forwards only what we return);
    an empty answer in the other modes, where Envoy keeps the chunk it sent."""
    if not streamed:
        return [pb.ProcessingResponse(response_body=pb.BodyResponse())]
    if len(body.body) > MAX_STREAMED_CHUNK:
        return streamed_body_responses(body.body, body.end_of_stream, request=False)
    resp = pb.ProcessingResponse()  # one chunk, the common case: built in place
    out = resp.response_body.response.body_mutation.streamed_response
    out.body = body.body
    out.end_of_stream = body.end_of_stream
    return [resp]


def response_trailers_passthrough() -> pb.ProcessingResponse:
    return pb.ProcessingResponse(response_trailers=pb.TrailersResponse())


def header_map(headers: pb.HttpHeaders) -> dict[str, str]:
    """Header map → dict with lower-case keys; raw_value preferred, as Envoy sends it."""
    out: dict[str, str] = {}
    for h in headers.headers.headers:
        value = h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value
        out[h.key.lower()] = value
    return out


def subset_hint(request: pb.ProcessingRequest) -> list[str] | None:
    """The gateway's candidate subset, if it sent one (present but empty means none)."""
    fm = request.metadata_context.filter_metadata
    if SUBSET_HINT_NAMESPACE not in fm:
        return None
    ns = fm[SUBSET_HINT_NAMESPACE]
    if DESTINATION_SUBSET not in ns.fields:
        return None
    value = ns.fields[DESTINATION_SUBSET]
    if value.HasField("list_value"):
        return [v.string_value for v in value.list_value.values if v.string_value]
    if value.HasField("string_value"):
        return [s.strip() for s in value.string_value.split(",") if s.strip()]
    return []
