"""Calibrated server shapes: `--preset NAME` (or `config_for(NAME, **overrides)`).

Each preset sets the scheduler limits, the KV-cache size and the step-time parameters
of `latency.py` (with `batch_slowdown=1`, so `decode_ms_per_token` is the cost of each
decoding sequence). Every number says where it comes from. Three kinds of source:

- **vLLM defaults**, read from vLLM's code: on GPUs with >= 70 GiB (H100) the OpenAI
  server defaults to `max_num_batched_tokens=8192` and `max_num_seqs=1024`
  (vllm/engine/arg_utils.py, `EngineArgs.get_batch_defaults`; vLLM PR #17885).
- **Published measurements**: the vLLM team's own serving benchmarks,
  (a) "vLLM v0.6.0: 2.7x Throughput Improvement and 5x Latency Reduction",
      https://blog.vllm.ai/2024/09/05/perf-update.html - Llama 3 8B on 1xH100 and 70B on
      4xH100, ShareGPT (500 prompts, mean 202 input / 179 output tokens), mean TTFT and
      TPOT at 2-32 QPS and QPS inf, read off the appendix plots (H100_8B.png,
      H100_70B.png) and the headline bars (TPOT at 32 QPS);
  (b) "vLLM V1: A Major Upgrade to vLLM's Core Architecture",
      https://blog.vllm.ai/2025/01/27/v1-alpha-release.html - mean end-to-end latency
      against QPS on ShareGPT for Llama 3.1 8B on 1xH100 and Llama 3.3 70B on 4xH100
      (v1_llama.png), and "execution time on the GPU is as low as ~5ms" for Llama-8B on H100;
  (c) llm-d KV-cache benchmark "37 capacity" (llm-d-kv-cache
      benchmarking/37-capacity/README.md): Llama-3.1-70B-Instruct with TP=4 on H100
      has 461,376 KV-cache tokens per pod.
- **Arithmetic from model and hardware facts** where nothing was published, shown in
  the comments (weights and KV bytes per token from the models' configs; H100 SXM:
  80 GiB HBM3).

Of the step-time parameters, the two bandwidth terms are arithmetic: `weight_read_ms`
(the weights read once) and `attention_ms_per_ktoken` (1000 tokens of KV read once), both
at 80% of the H100 SXM's 3.35 TB/s of HBM bandwidth (NVIDIA's datasheet; 80% is an
assumed achievable fraction). The other two, `step_base_ms` and the per-token compute
cost (`prefill_ms_per_token` = `decode_ms_per_token`), were fitted by
`bench/sim_calibration.py --fit`, which replays the benchmarks' workloads (synthetic
ShareGPT-like lengths with the published means) through this simulator's scheduler in
virtual time and minimises the squared log error against (a) and (b) together;
`docs/sim.md` shows the result beside the published points (docs/sim_calibration.png)
and discusses where they disagree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from epp.sim.config import SimConfig

H100_SERVER_DEFAULTS = "vllm/engine/arg_utils.py get_batch_defaults (>=70 GiB GPU, OpenAI server)"
# Presets whose prefill cost per token is measured on the hardware, not fitted
# (bench/sim_calibration.py --fit then fits the fixed and the decode cost only).
MEASURED_PREFILL = frozenset({"llama-3.1-8b-h100"})


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    values: Mapping[str, Any]
    sources: Mapping[str, str] = field(default_factory=dict)


TINY = Preset(
    name="tiny",
    description="a toy server for fast tests: small cache, ms-scale steps",
    values={
        "max_num_seqs": 8,
        "max_num_batched_tokens": 256,
        "kv_capacity_tokens": 128 * 16,
        "block_size": 16,
        "max_model_len": 1024,
        "step_base_ms": 2.0,
        "prefill_ms_per_token": 0.01,
        "decode_ms_per_token": 0.1,
        "batch_slowdown": 1.0,
        "attention_ms_per_ktoken": 0.0,
        "lora_load_ms": 5.0,
        "kv_transfer_ms_per_token": 0.01,
    },
    sources={"*": "not calibrated: small numbers so tests run in milliseconds"},
)

LLAMA_8B_H100 = Preset(
    name="llama-3.1-8b-h100",
    description="Llama 3.1 8B Instruct, bf16, one H100 SXM 80GB, vLLM V1 defaults",
    values={
        "max_num_seqs": 1024,
        "max_num_batched_tokens": 8192,
        # 80 GiB x 0.9 (gpu_memory_utilization) = 72 GiB; minus 14.99 GiB of weights (the
        # "Loading model weights took 14.99 GB" line vLLM logs for Llama-3.1-8B) and ~3 GiB
        # of activations and CUDA graphs = ~54 GiB of KV cache. Llama 3.1 8B keeps
        # 32 layers x 8 KV heads x 128 dims x 2 (K, V) x 2 bytes = 128 KiB per token, so
        # 54 GiB / 128 KiB = 442,368 tokens = 27,648 blocks of 16.
        "kv_capacity_tokens": 27_648 * 16,
        "block_size": 16,
        "max_model_len": 131_072,  # Llama 3.1's context length (its config.json)
        # Fitted (bench/sim_calibration.py --fit, prefill fixed at the measured value
        # below): loss 0.034, see docs/sim.md. Fixed per-step cost: launches, sampling,
        # scheduling (vLLM's CPU work per step: the measured GPU floor of a batch-1
        # decode step is 6.7 ms, vLLM's published TPOT at 2 QPS 8.6 ms).
        "step_base_ms": 3.24,
        # 16.06 GB of bf16 weights read once at 80% of the H100 SXM's 3.35 TB/s (NVIDIA's
        # datasheet figure): 16.06e9 / 2.68e12 s = 6.0 ms; the V1 blog (b) puts the GPU
        # time of a Llama-8B step on H100 at "as low as ~5ms".
        "weight_read_ms": 6.0,
        # Measured, not fitted: the GPU time of an 8B-shaped forward pass on one H100
        # (PyTorch, bf16) is 0.024-0.026 ms per prompt token in an 8,192-token step
        # (198.5-215.3 ms as 64 x 128 ... 2 x 4,096 tokens) and 0.026 for one prompt of
        # 1-4k tokens: ~620 TFLOP/s, 63 % of the 989 dense bf16. vLLM's own overhead on
        # a prefill is per step (step_base_ms), not per token, so the floor is the cost.
        # The earlier fit (0.045, tied to decode) was not constrained by prefill: the
        # published workloads' prompts average 202 tokens. Attention's quadratic share
        # is not modelled: a 16k prompt costs 0.85x its measured time.
        "prefill_ms_per_token": 0.026,
        # Fitted to (a) and (b) with prefill fixed at the measured value: what a served
        # decoding sequence costs a vLLM step at serving batch sizes, its per-sequence
        # CPU work (sampling, output processing, input preparation) included; the GPU
        # floor alone is ~0.01 ms per extra sequence beyond the context read.
        "decode_ms_per_token": 0.074,
        "batch_slowdown": 1.0,
        # 1000 tokens of KV (128 KiB each) read at 80% of 3.35 TB/s: 131 MB / 2.68 TB/s.
        "attention_ms_per_ktoken": 0.049,
        # A rank-16 adapter on all 7 projections of 32 layers is ~42M params = 84 MB;
        # read from local NVMe at ~3 GB/s that is ~30 ms (a CPU-cached one is faster).
        "lora_load_ms": 30.0,
        # 128 KiB per token over a 400 Gb/s (50 GB/s) RDMA NIC (ConnectX-7, the H100
        # servers' NIC) = 2.6 us per token.
        "kv_transfer_ms_per_token": 0.0026,
    },
    sources={
        "max_num_seqs": H100_SERVER_DEFAULTS,
        "max_num_batched_tokens": H100_SERVER_DEFAULTS,
        "kv_capacity_tokens": "arithmetic: H100 80 GiB, bf16 weights and KV (comment)",
        "step time": "fitted to (a) and (b), bench/sim_calibration.py --fit",
        "prefill_ms_per_token": "measured GPU time of an 8B-shaped prefill on one H100",
    },
)

LLAMA_70B_4XH100 = Preset(
    name="llama-3.1-70b-4xh100",
    description="Llama 3.1/3.3 70B Instruct, bf16, tensor parallel over 4 H100 SXM 80GB",
    values={
        "max_num_seqs": 1024,
        "max_num_batched_tokens": 8192,
        # Published: 461,376 KV-cache tokens per TP=4 pod (source (c)) = 28,836 blocks.
        "kv_capacity_tokens": 461_376,
        "block_size": 16,
        "max_model_len": 131_072,
        # Fitted (bench/sim_calibration.py --fit): loss 0.008, see docs/sim.md.
        "step_base_ms": 10.2,
        # 141.1 GB of bf16 weights over 4 GPUs = 35.3 GB each, read at 80% of 3.35 TB/s:
        # 13.2 ms.
        "weight_read_ms": 13.2,
        "prefill_ms_per_token": 0.106,  # fitted; 2 x 70.6 GFLOP at ~34% of 4 x 989 TFLOPS
        "decode_ms_per_token": 0.106,
        "batch_slowdown": 1.0,
        # 1000 tokens of KV, 320 KiB each split over 4 GPUs = 82 MB per GPU at 2.68 TB/s.
        "attention_ms_per_ktoken": 0.031,
        # Rank 16 on 80 layers with hidden size 8192: ~207M params = 414 MB from NVMe at
        # ~3 GB/s (split over 4 GPUs, read once) = ~140 ms.
        "lora_load_ms": 140.0,
        # 80 layers x 8 KV heads x 128 x 2 x 2 bytes = 320 KiB per token, 4 NICs of
        # 50 GB/s in parallel (one per GPU) = 1.6 us per token.
        "kv_transfer_ms_per_token": 0.0016,
    },
    sources={
        "max_num_seqs": H100_SERVER_DEFAULTS,
        "max_num_batched_tokens": H100_SERVER_DEFAULTS,
        "kv_capacity_tokens": "published: (c), 461,376 tokens per TP=4 pod",
        "step time": "fitted to (a) and (b), bench/sim_calibration.py --fit",
    },
)

PRESETS: dict[str, Preset] = {p.name: p for p in (TINY, LLAMA_8B_H100, LLAMA_70B_4XH100)}
ALIASES = {"8b-h100": LLAMA_8B_H100.name, "70b-4xh100": LLAMA_70B_4XH100.name}


def get(name: str) -> Preset:
    preset = PRESETS.get(ALIASES.get(name, name))
    if preset is None:
        raise ValueError(f"unknown preset {name!r}; known: {sorted([*PRESETS, *ALIASES])}")
    return preset


def config_for(name: str | None, base: SimConfig | None = None, **overrides: Any) -> SimConfig:
    """`base` (default `SimConfig()`) with the preset's values, then `overrides`."""
    config = base or SimConfig()
    if name is None:
        return replace(config, **overrides)
    preset = get(name)
    return replace(config, preset=preset.name, **{**preset.values, **overrides})
