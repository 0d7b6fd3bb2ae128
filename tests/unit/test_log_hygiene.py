"""Logs never print request bodies or credentials (issue 13 §5): a request carrying an
Authorization header and a recognisable prompt goes through every path that logs
(routed, each refusal, a failing plugin, the sidecar's refusal and fallback), with
every logger at DEBUG; neither the secret nor the prompt appears in any line."""

import json
import logging

from epp.extproc.refusals import RefusalLog
from epp.extproc.stream import RequestStream
from epp.headers import PREFILLER_HOST_PORT
from epp.limits import BodyLimits
from epp.sim import SimServer
from tests.unit.test_sidecar import FAST, post, sidecar_for
from tests.unit.test_stream import BASE_HEADERS, body_msg, headers_msg, make_director

SECRET = "sk-CANARY-SECRET-0123456789"
PROMPT = "CANARY-PROMPT-do-not-log " * 40
HEADERS = {**BASE_HEADERS, "authorization": f"Bearer {SECRET}", "cookie": f"s={SECRET}"}


def logged(caplog) -> str:
    return "\n".join(
        r.getMessage() + (str(r.exc_info[1]) if r.exc_info else "") for r in caplog.records
    )


def bodies() -> list[bytes]:
    ok = {"model": "m", "prompt": PROMPT}
    return [
        json.dumps(ok).encode(),  # routed
        json.dumps({**ok, "max_tokens": -1}).encode(),  # 400
        json.dumps({**ok, "model": "unknown"}).encode(),  # 404
        json.dumps({"model": "m", "prompt": PROMPT * 100}).encode(),  # 400 prompt tokens
        json.dumps({"model": "m", "prompt": [PROMPT], "a": [[[[[[]]]]]]}).encode(),  # depth
        ("{" + PROMPT).encode(),  # invalid JSON
    ]


def test_the_epp_logs_neither_credentials_nor_prompts(caplog):
    caplog.set_level(logging.DEBUG)
    director, _ = make_director(models=["m"])
    limits = BodyLimits(max_json_depth=4, max_prompt_tokens=5000)
    # Its own refusal log: the process-wide one is rate-limited across tests.
    refusals = RefusalLog(logging.getLogger("epp.extproc"))
    for body in bodies():
        s = RequestStream(director, 1 << 20, refusals=refusals, body_limits=limits)
        s.handle(headers_msg(HEADERS))
        s.handle(body_msg(body, True))
        s.close()
    s = RequestStream(director, 100, refusals=refusals)  # 413
    s.handle(headers_msg(HEADERS))
    s.handle(body_msg(bodies()[0], True))
    text = logged(caplog)
    assert "answered 400" in text and "answered 404" in text and "answered 413" in text
    assert SECRET not in text and "CANARY-PROMPT" not in text


async def test_the_sidecar_logs_neither_credentials_nor_prompts(caplog):
    caplog.set_level(logging.DEBUG)
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 2}
    auth = {"authorization": f"Bearer {SECRET}"}
    async with (
        SimServer("pre-0", FAST) as pre,
        SimServer("dec-0", FAST) as dec,
        sidecar_for(dec.url, f"127.0.0.1:{pre.port}") as sc,
    ):
        pre.set_faults(fail_rate=1.0)  # the prefill fails: logged, decoded locally
        status, _, _ = await post(
            sc.url, body, {**auth, PREFILLER_HOST_PORT: f"127.0.0.1:{pre.port}"}
        )
        assert status == 200
        status, _, _ = await post(sc.url, body, {**auth, PREFILLER_HOST_PORT: "10.9.9.9:1"})
        assert status == 403
    text = logged(caplog)
    assert "refused prefill server" in text and "decoding locally" in text
    assert SECRET not in text and "CANARY-PROMPT" not in text
