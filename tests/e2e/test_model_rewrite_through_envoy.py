"""A weighted InferenceModelRewrite end to end: Envoy → `epp serve --model-rewrites` → two
simulators, one serving `llama-v1`, the other `llama-v2`.

The manifest is shaped as llm-d-router's (`llm-d.ai/v1alpha2`, an objective in the same
file). Checked: each request reaches the server of the target its `x-request-id` hashes
to, the split follows the 90/10 weights, a retried request (same id) keeps its target,
and the header-only rewrite (`x-gateway-model-name-rewrite`) still applies to a model no
rule matches. The 10k-request split is tested on the same code in
tests/unit/test_rewrite.py and measured through Envoy by bench/rewrite_split.py.
"""

import asyncio
import json

import aiohttp
import pytest

from epp.harness.localstack import LocalStack
from epp.rewrite import ModelRewrites, load_rewrites_file
from tests.e2e.conftest import SIM_ARGS
from tests.unit.test_rewrite import CANARY

pytestmark = pytest.mark.e2e

# llm-d-router's shapes: a 90/10 InferenceModelRewrite of `llama`, an objective.
MANIFEST = CANARY


@pytest.fixture(scope="module")
def rewrite_stack(tmp_path_factory):
    path = tmp_path_factory.mktemp("rw") / "resources.yaml"
    path.write_text(MANIFEST)
    args = ["--model-rewrites", str(path), "--objectives", str(path)]
    per_sim = {0: ["--model", "llama-v1"], 1: ["--model", "llama-v2"]}
    with LocalStack(n_sims=2, sim_args=SIM_ARGS, per_sim_args=per_sim, epp_args=args) as st:
        yield st, ModelRewrites.build(load_rewrites_file(path))


async def ask(session, url: str, model: str, rid: str, headers: dict | None = None) -> tuple:
    body = {"model": model, "prompt": "hello", "max_tokens": 2}
    hdrs = {"x-request-id": rid, "x-gateway-inference-objective": "critical", **(headers or {})}
    async with session.post(url + "/v1/completions", json=body, headers=hdrs) as r:
        data = json.loads(await r.read())
        server = r.headers.get("x-sim-server", "")  # "<sim name>-<replica>"
        return r.status, data.get("model"), server.rsplit("-", 1)[0]


async def test_weighted_rewrite_splits_by_request_id_and_retries_keep_their_target(
    rewrite_stack,
):
    st, table = rewrite_stack
    servers = {"llama-v1": st.sims[0].name, "llama-v2": st.sims[1].name}
    ids = [f"req-{i:04d}" for i in range(400)]
    sem = asyncio.Semaphore(16)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:

        async def one(rid: str) -> tuple:
            async with sem:
                return await ask(s, st.url, "llama", rid)

        replies = await asyncio.gather(*(one(rid) for rid in ids))
        retries = [await ask(s, st.url, "llama", rid) for rid in ids[:20] for _ in range(2)]
    expected = [table.target("llama", rid) for rid in ids]
    assert [r[0] for r in replies] == [200] * len(ids)
    assert [r[1] for r in replies] == expected  # the model each id hashes to ...
    assert [r[2] for r in replies] == [servers[m] for m in expected]  # ... and its server
    share = expected.count("llama-v2") / len(ids)
    assert 0.05 <= share <= 0.15, share  # 400 draws of a 10 % share
    assert [r[1] for r in retries] == [m for m in expected[:20] for _ in range(2)]


async def test_header_rewrite_still_applies_where_no_rule_matches(rewrite_stack):
    st, _ = rewrite_stack
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        status, model, server = await ask(
            s, st.url, "unmatched", "h-1", {"x-gateway-model-name-rewrite": "llama-v2"}
        )
    assert (status, model, server) == (200, "llama-v2", st.sims[1].name)
