"""The Mooncake replay of `epp bench routing --scenario mooncake` (bench/routing_trace.py):
prompts share exactly the prefix blocks the trace says they share, the token scaling and
the caps hold, and the stages replay the trace's last requests at their rates."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from types import SimpleNamespace

from bench import routing as routing_module
from bench import routing_trace
from epp.tokenizer import SimpleTokenizer

ROOT = Path(__file__).resolve().parents[2]


trace = routing_trace
routing = routing_module
TOK = SimpleTokenizer()


def row(at_ms: float, input_length: int, hash_ids: list[int], out: int = 10):
    return trace.TraceRow(at_ms, input_length, out, tuple(hash_ids))


def test_equal_hash_ids_give_equal_blocks_and_nothing_more() -> None:
    blocks = trace.Blocks(8, routing.words)
    # 3 ids x 512 tokens in the trace = 3 blocks of 8 tokens here (scale 8/512).
    a, n_a = blocks.prompt(row(0, 3 * 512, [1, 2, 3]), max_prompt=1000)
    b, n_b = blocks.prompt(row(0, 3 * 512, [1, 2, 4]), max_prompt=1000)
    c, _ = blocks.prompt(row(0, 3 * 512, [5, 2, 3]), max_prompt=1000)
    ta, tb, tc = TOK.encode(a), TOK.encode(b), TOK.encode(c)
    assert n_a == n_b == len(ta) == len(tb) == 24  # one simulator token per word
    assert ta[:16] == tb[:16] and ta[16:] != tb[16:]  # ids 1, 2 shared, then 3 vs 4
    assert ta[:8] != tc[:8]  # another first block: no shared prefix at all
    assert len(a) == 4 * 24  # 4 characters per token for the approximate index


def test_last_block_is_cut_to_the_input_length_and_long_prompts_to_the_context() -> None:
    blocks = trace.Blocks(32, routing.words)
    # 2 full blocks + 256 of 512 tokens: 2 x 32 + ceil(256 x 32 / 512) = 64 + 16 = 80.
    _, n = blocks.prompt(row(0, 2 * 512 + 256, [7, 8, 9]), max_prompt=1000)
    assert n == 80
    full, _ = blocks.prompt(row(0, 3 * 512, [7, 8, 9]), max_prompt=1000)
    cut, n_cut = blocks.prompt(row(0, 3 * 512, [7, 8, 9]), max_prompt=40)
    assert n_cut == 40 and TOK.encode(full)[:40] == TOK.encode(cut)  # the prefix stays


def test_stages_replay_the_last_requests_at_each_rate(tmp_path: Path) -> None:
    # 400 requests, one every 100 ms of trace time (10 req/s), all with 20 output tokens.
    path = tmp_path / "t.jsonl"
    lines = [
        {"timestamp": 100 * i, "input_length": 600, "output_length": 20, "hash_ids": [i, i + 1]}
        for i in range(400)
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines))
    args = SimpleNamespace(
        trace="mooncake", trace_file=str(path), rates=[8.0, 16.0], warmup_s=1.0, stage_s=5.0,
        time_scale=0.5, block_tokens=16, kv_tokens=1000, output_tokens=12,
    )  # fmt: skip
    reqs = trace.workload(args, routing.Req, routing.words)
    # Real rates: 8 x 0.5 = 4 req/s (warm-up 1 s, stage 5 s), then 16 x 0.5 = 8 req/s
    # for 5 s: about 4 + 20 + 40 = 64 requests, the trace's last ones.
    by_stage = [sum(r.stage == k for r in reqs) for k in (-1, 0, 1)]
    assert by_stage == [4, 20, 40]
    # The replay starts where the tail it needs starts: 64 expected x 1.05 + 1 = 69 rows
    # before the end, row 331 (ids 331, 332), and goes on in trace order.
    assert (
        reqs[0].prompt
        == trace.Blocks(16, routing.words).prompt(
            trace.TraceRow(33100, 600, 20, (331, 332)), 1000 - 12
        )[0]
    )
    assert reqs[0].at == 0.0
    assert {r.max_tokens for r in reqs} == {12}  # the trace's 20, capped
    assert all(b.at > a.at for a, b in itertools.pairwise(reqs))
