"""The in-place response builders (epp/extproc/messages.py) produce exactly the messages
the nested-constructor form built before them, field presence included: Envoy reads an
empty-but-present `response` differently from an absent one."""

from __future__ import annotations

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf import struct_pb2

from epp.extproc import messages as m
from epp.headers import DESTINATION_ENDPOINT, LB_METADATA_NAMESPACE

_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


# ---- the constructor-built references (the builders' previous code) ----
def ref_mutation(set_headers: dict[str, str], remove: list[str]) -> pb.HeaderMutation:
    return pb.HeaderMutation(
        set_headers=[
            base_pb2.HeaderValueOption(
                header=base_pb2.HeaderValue(key=k, raw_value=v.encode()), append_action=_OVERWRITE
            )
            for k, v in set_headers.items()
        ],
        remove_headers=list(remove),
    )


def ref_metadata(destinations: list[str]) -> struct_pb2.Struct:
    md = struct_pb2.Struct()
    md.fields[LB_METADATA_NAMESPACE].struct_value.fields[
        DESTINATION_ENDPOINT
    ].string_value = ",".join(destinations)
    return md


def ref_headers_response(
    mutation: pb.HeaderMutation, clear: bool, md: struct_pb2.Struct | None
) -> pb.ProcessingResponse:
    resp = pb.ProcessingResponse(
        request_headers=pb.HeadersResponse(
            response=pb.CommonResponse(header_mutation=mutation, clear_route_cache=clear)
        )
    )
    if md is not None:
        resp.dynamic_metadata.CopyFrom(md)
    return resp


def ref_streamed(body: bytes, eos: bool, request: bool) -> list[pb.ProcessingResponse]:
    chunks = [body[i : i + 62_000] for i in range(0, len(body), 62_000)] or [b""]
    out = []
    for i, chunk in enumerate(chunks):
        common = pb.CommonResponse(
            body_mutation=pb.BodyMutation(
                streamed_response=pb.StreamedBodyResponse(
                    body=chunk, end_of_stream=eos and i == len(chunks) - 1
                )
            )
        )
        body_response = pb.BodyResponse(response=common)
        out.append(
            pb.ProcessingResponse(request_body=body_response)
            if request
            else pb.ProcessingResponse(response_body=body_response)
        )
    return out


HEADER_SETS = [
    ({}, []),
    ({}, ["x-gateway-destination-endpoint", "x-prefiller-host-port"]),
    ({DESTINATION_ENDPOINT: "10.0.0.1:8000", "content-length": "295"}, ["x-prefiller-host-port"]),
    ({DESTINATION_ENDPOINT: "[::1]:8000", "x-request-id": "é-ü"}, []),
]


@pytest.mark.parametrize(("set_headers", "remove"), HEADER_SETS)
@pytest.mark.parametrize("clear", [False, True])
@pytest.mark.parametrize("destinations", [None, ["10.0.0.1:8000"], ["a:1", "b:2"]])
def test_headers_response_in_place_equals_constructed(
    set_headers: dict[str, str], remove: list[str], clear: bool, destinations: list[str] | None
) -> None:
    md = ref_metadata(destinations) if destinations is not None else None
    want = ref_headers_response(ref_mutation(set_headers, remove), clear, md)
    got = m.headers_response(
        set_headers=set_headers, remove=remove, clear_route_cache=clear, destinations=destinations
    )
    assert got == want
    assert got.SerializeToString(deterministic=True) == want.SerializeToString(deterministic=True)
    # The prebuilt-mutation form gives the same message.
    assert m.headers_response(m.header_mutation(set_headers, remove), clear, md) == want


@pytest.mark.parametrize("size", [0, 1, 295, 62_000, 62_001, 124_000, 130_000])
@pytest.mark.parametrize("eos", [False, True])
@pytest.mark.parametrize("request_side", [False, True])
def test_streamed_body_in_place_equals_constructed(
    size: int, eos: bool, request_side: bool
) -> None:
    body = bytes(range(256)) * (size // 256) + bytes(size % 256)
    want = ref_streamed(body, eos, request_side)
    got = m.streamed_body_responses(body, eos, request=request_side)
    assert got == want
    # 130,000 bytes = 62,000 + 62,000 + 6,000: three chunks, only the last may end the stream.
    assert len(got) == max(1, -(-size // 62_000))


def test_empty_answers_are_present_but_empty() -> None:
    assert m.request_trailers_response() == pb.ProcessingResponse(
        request_trailers=pb.TrailersResponse()
    )
    assert m.response_headers_passthrough() == pb.ProcessingResponse(
        response_headers=pb.HeadersResponse()
    )
    assert m.response_trailers_passthrough() == pb.ProcessingResponse(
        response_trailers=pb.TrailersResponse()
    )
    assert m.empty_request_body_response() == pb.ProcessingResponse(request_body=pb.BodyResponse())
    assert m.empty_request_body_response().WhichOneof("response") == "request_body"
    chunk = pb.HttpBody(body=b"data: x\n\n", end_of_stream=False)
    assert m.response_body_passthrough(chunk, streamed=False) == [
        pb.ProcessingResponse(response_body=pb.BodyResponse())
    ]
    assert m.response_body_passthrough(chunk, streamed=True) == ref_streamed(
        chunk.body, False, request=False
    )


def test_headers_response_refuses_both_forms() -> None:
    with pytest.raises(ValueError, match="not both"):
        m.headers_response(m.header_mutation({}), set_headers={"a": "b"})
    with pytest.raises(ValueError, match="not both"):
        m.headers_response(metadata=ref_metadata(["a:1"]), destinations=["a:1"])
