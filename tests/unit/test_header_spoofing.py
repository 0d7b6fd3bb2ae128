"""Every request header the EPP reads, checked for what a client could do by setting it
(issue 13 §5). The full table (header, who may set it, what a client's value does) is
in docs/RELIABILITY.md; one test per header here.
"""

import json

import pytest

from epp.extproc.stream import RequestStream
from epp.headers import (
    DESTINATION_ENDPOINT,
    DESTINATION_SUBSET,
    FAIRNESS_ID,
    MODEL_REWRITE,
    OBJECTIVE,
    PREFILLER_HOST_PORT,
    SESSION_TOKEN,
)
from epp.request import new_request
from plugins.scorers.session_affinity import MAX_SESSION_ID_CHARS
from tests.helpers import plugin
from tests.unit.test_stream import BASE_HEADERS, BODY, body_msg, headers_msg, make_director


def route(extra: dict[str, str], body: bytes = BODY, models=None):
    director, ds = make_director(models=models)
    s = RequestStream(director, 1 << 20)
    s.handle(headers_msg({**BASE_HEADERS, **extra}))
    out = s.handle(body_msg(body, True))
    s.close()
    return out, {e.hostport for e in ds.endpoints()}


def mutation(out):
    hm = out[0].request_headers.response.header_mutation
    return {h.header.key: h.header.raw_value.decode() for h in hm.set_headers}, set(
        hm.remove_headers
    )


def test_a_client_destination_is_overwritten_with_the_pick():
    out, pool = route({DESTINATION_ENDPOINT: "169.254.169.254:80"})
    sets, _ = mutation(out)
    assert sets[DESTINATION_ENDPOINT] in pool
    assert (
        out[0]
        .dynamic_metadata.fields["envoy.lb"]
        .struct_value.fields[DESTINATION_ENDPOINT]
        .string_value
        in pool
    )


def test_a_client_prefiller_header_is_removed():
    out, _ = route({PREFILLER_HOST_PORT: "169.254.169.254:80"})
    sets, removed = mutation(out)
    assert PREFILLER_HOST_PORT in removed and PREFILLER_HOST_PORT not in sets


def test_a_subset_hint_sent_as_a_header_is_ignored():
    # Only Envoy metadata carries the subset; as a header it would have narrowed the
    # pool to an address outside it (-> 503). It routes normally instead.
    out, pool = route({DESTINATION_SUBSET: "169.254.169.254:80"})
    assert mutation(out)[0][DESTINATION_ENDPOINT] in pool


def test_a_rewrite_to_a_model_the_pool_does_not_serve_is_a_404():
    out, _ = route({MODEL_REWRITE: "not-served"}, models=["m"])
    ir = out[0].immediate_response
    assert ir.status.code == 404
    assert "not-served" in json.loads(ir.body)["error"]["message"]


@pytest.mark.parametrize("header", [OBJECTIVE, FAIRNESS_ID])
@pytest.mark.parametrize("value", ["a\tb", "x" * 129, "new\nline", "ünï"])
def test_objective_and_fairness_headers_that_are_not_short_tokens_are_ignored(header, value):
    req = new_request({header: value}, "/v1/completions", "POST")
    assert (req.objective, req.fairness_id) == (None, None)
    ok = new_request({header: "premium"}, "/v1/completions", "POST")
    assert "premium" in (ok.objective, ok.fairness_id)


def test_a_huge_session_token_costs_the_affinity_map_a_bounded_key():
    scorer = plugin("session-affinity-scorer")
    huge = "s" * 60_000  # Envoy's whole header budget in one value
    req = new_request({SESSION_TOKEN: huge}, "/v1/completions", "POST")
    sid = scorer._session_id(req)
    assert len(sid) <= 8 + 128  # "blake2b:" + 128 hex digits
    assert sid != scorer._session_id(new_request({SESSION_TOKEN: huge + "t"}, "/", "POST"))
    short = "s" * MAX_SESSION_ID_CHARS
    assert scorer._session_id(new_request({SESSION_TOKEN: short}, "/", "POST")) == short
