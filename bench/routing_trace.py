"""Trace replay for `epp bench routing` (the `mooncake` scenario; loaded by path from
bench/routing.py).

The trace (../shared/traces/mooncake-synthetic.jsonl, Mooncake FAST'25) gives per request
an arrival time, input and output lengths and `hash_ids`: 512-token prefix blocks, equal
ids = equal content. A request's prompt is its blocks' texts in order, each block the
same seeded words wherever its id appears (`block_text`), the last block cut to the
input length; so two requests share exactly the prefix blocks the trace says they share.

Scaling, both said in the scenario's description:
- tokens: each hash id stands for `block_tokens` tokens instead of 512 (a prompt keeps
  its block count and its last block's share), so a 2-core machine can push the prompts
  through Envoy, the EPP and the simulator; the KV cache is sized against the scaled
  working set;
- time: the trace's inter-arrival gaps (burstiness kept) are scaled so that each stage
  runs at its rate; the replay takes the trace's last requests (as many as the stages
  are expected to need, plus 5 %), where most reuse happens: its later requests return
  to prefixes seen minutes earlier (reuse distance median ~260 requests), its first
  ~1,000 barely reuse at all.

Prompts longer than the simulator's context (`max_prompt`) lose their trailing blocks
(the shared prefix stays); output lengths are the trace's, capped at `output_tokens`.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TRACES = {"mooncake": ROOT.parent / "shared" / "traces" / "mooncake-synthetic.jsonl"}
TRACE_BLOCK = 512  # tokens per hash id in the Mooncake release


@dataclass(frozen=True)
class TraceRow:
    at_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def load(path: Path) -> list[TraceRow]:
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            rows.append(
                TraceRow(
                    float(d["timestamp"]),
                    int(d["input_length"]),
                    int(d["output_length"]),
                    tuple(int(h) for h in d["hash_ids"]),
                )
            )
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}:{n}: not a Mooncake trace line ({e})") from None
    return rows


class Blocks:
    """Block texts by hash id: `words(rng, n)` of a generator seeded by the id, so equal
    ids give equal text; every word is one token for the simulator's tokenizer and 4
    characters for the approximate index, and each block ends with a space, so blocks
    concatenate on token boundaries."""

    def __init__(self, block_tokens: int, words: Callable[[random.Random, int], str]) -> None:
        self.block_tokens, self.words = block_tokens, words
        self.texts: dict[int, list[str]] = {}

    def tokens(self, hash_id: int) -> list[str]:
        got = self.texts.get(hash_id)
        if got is None:
            got = self.texts[hash_id] = self.words(
                random.Random(hash_id * 1_000_003 + 7), self.block_tokens
            ).split(" ")
        return got

    def prompt(self, row: TraceRow, max_prompt: int) -> tuple[str, int]:
        """The row's prompt text and its length in tokens (scaled, capped)."""
        b = self.block_tokens
        n = len(row.hash_ids)
        last = row.input_length - TRACE_BLOCK * (n - 1)  # tokens of the last block
        total = (n - 1) * b + max(1, math.ceil(last * b / TRACE_BLOCK))
        total = min(total, max_prompt)
        out: list[str] = []
        for h in row.hash_ids:
            if len(out) >= total:
                break
            out += self.tokens(h)[: total - len(out)]
        return " ".join(out) + " ", len(out)


def pick(rows: Sequence[TraceRow], needed: int) -> list[TraceRow]:
    """The last `needed` rows (all of them if the trace is shorter)."""
    return list(rows[max(0, len(rows) - needed) :])


def workload(args: Any, make_req: Callable[..., Any], words: Callable[..., str]) -> list[Any]:
    """`make_req(at, stage, prompt, max_tokens)` per replayed request, in order: a warm-up
    at the first rate, then one stage per rate (rates in model req/s, times in real s)."""
    path = Path(args.trace_file) if args.trace_file else TRACES[args.trace]
    rows = load(path)
    stages = [(-1, args.rates[0], args.warmup_s)] + [
        (k, rate, args.stage_s) for k, rate in enumerate(args.rates)
    ]
    expected = sum(rate * args.time_scale * length for _, rate, length in stages)
    chosen = pick(rows, math.ceil(expected * 1.05) + 1)
    span_ms = chosen[-1].at_ms - chosen[0].at_ms
    trace_rate = (len(chosen) - 1) / (span_ms / 1000) if span_ms > 0 else 1.0
    blocks = Blocks(args.block_tokens, words)
    max_prompt = args.kv_tokens - args.output_tokens  # the simulator's --max-model-len
    reqs: list[Any] = []
    k, t = 0, 0.0  # the current stage; real time of the previous arrival
    ends = [sum(length for _, _, length in stages[: j + 1]) for j in range(len(stages))]
    for i, row in enumerate(chosen):
        gap = 0.0 if i == 0 else (row.at_ms - chosen[i - 1].at_ms) / 1000  # trace seconds
        while k < len(stages):  # a gap that crosses a stage's end goes on at the next rate
            stretch = trace_rate / (stages[k][1] * args.time_scale)  # trace s -> real s
            if t + gap * stretch < ends[k]:
                t += gap * stretch
                break
            gap -= (ends[k] - t) / stretch
            t, k = ends[k], k + 1
        if k == len(stages):
            break
        prompt, _ = blocks.prompt(row, max_prompt)
        out = max(1, min(row.output_length, args.output_tokens))
        reqs.append(make_req(t, stages[k][0], prompt, out))
    return reqs


def describe(args: Any) -> str:
    return (
        f"{args.scenario}: the last requests of the {args.trace} trace, "
        f"{args.block_tokens} tokens per hash id (the trace's 512 scaled by "
        f"{args.block_tokens / TRACE_BLOCK:g}), output = the trace's capped at "
        f"{args.output_tokens}; {args.servers} x {args.preset}, KV {args.kv_tokens} tokens "
        f"each, time scale {args.time_scale:g}; stages {args.stage_s:g} s real at the "
        f"trace's gaps scaled to each rate; median of {args.repeat}"
    )
