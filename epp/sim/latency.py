"""How long one engine step takes, from what the scheduler put in it.

A step of vLLM's V1 engine is one forward pass over every scheduled token: the prefill
chunks and one token per decoding sequence. Its time is modelled as linear in three
things a real step scales with:

- a fixed cost per step (kernel launches, sampling, the CPU work around the step):
  `step_base_ms`;
- the matmuls, a roofline: a small batch is memory-bound, so it costs what reading the
  weights from HBM once costs (`weight_read_ms`); a large one is compute-bound, linear
  in its tokens (`prefill_ms_per_token` per prefill token, plus a decode term:
  `decode_ms_per_token`, with `batch_slowdown` for the original shape). The step pays
  the larger of the two;
- the context attended (attention reads every cached token of every sequence in the
  step): `attention_ms_per_ktoken` per thousand tokens.

Step models linear in batched tokens and KV reads are what serving simulators fit in
practice (Vidur, Agrawal et al., MLSys 2024, https://arxiv.org/abs/2405.05465); the
memory floor is the roofline argument (Williams et al., CACM 2009) that makes decode
latency flat until the batch is large. The presets' numbers and sources are in
`presets.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

from epp.sim.config import SimConfig


@dataclass(frozen=True, slots=True)
class StepShape:
    """What a step's cost depends on; built by the scheduler for each step."""

    prefill_tokens: int = 0  # prompt (or recomputed) tokens computed this step
    decode_seqs: int = 0  # sequences producing their next token from one new token
    context_tokens: int = 0  # sum over scheduled sequences of the tokens they attend to
    lora_loads: int = 0  # adapters moved into a GPU slot before this step

    @property
    def empty(self) -> bool:
        return not (self.prefill_tokens or self.decode_seqs or self.lora_loads)


class StepCostModel:
    """`seconds(shape)`: the model-time length of one step. Subclass to change the model."""

    def __init__(self, config: SimConfig) -> None:
        self.base = config.step_base_ms
        self.floor = config.weight_read_ms
        self.prefill = config.prefill_ms_per_token
        self.decode = config.decode_ms_per_token
        self.slowdown = config.batch_slowdown
        self.attention = config.attention_ms_per_ktoken
        self.lora_load = config.lora_load_ms

    def decode_terms(self, decodes: int) -> tuple[float, float]:
        """For a step of `decodes` decoding sequences and nothing else: (seconds the
        step costs without context, seconds per context token). `seconds()` is linear in
        the context, so a run of such steps has a closed-form total; the virtual engine
        (`epp.sim.virtual`) jumps over runs of decode steps with it. A subclass that
        changes `seconds()` must change this to match."""
        matmul = self.decode * (1.0 + self.slowdown * (decodes - 1))
        return (self.base + max(self.floor, matmul)) / 1000.0, self.attention / 1e6

    def seconds(self, shape: StepShape) -> float:
        if shape.empty:
            return 0.0
        matmul = self.prefill * shape.prefill_tokens
        if shape.decode_seqs:
            matmul += self.decode * (1.0 + self.slowdown * (shape.decode_seqs - 1))
        ms = self.base + max(self.floor, matmul) + self.attention * shape.context_tokens / 1000.0
        ms += self.lora_load * shape.lora_loads
        return ms / 1000.0
