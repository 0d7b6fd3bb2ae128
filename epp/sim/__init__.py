"""A vLLM-compatible model-server simulator whose latency reacts to load the way vLLM's
does: continuous batching, a paged KV cache with prefix caching, preemption, LoRA slots,
KV events over ZMQ and the P/D `kv_transfer_params` protocol; cheap enough to run
sixteen servers in one process. docs/sim.md is the user guide.

Modules, one job each:

- `config`: `SimConfig` (shape and speed, fixed) and `Faults` (misbehaviour, live).
- `presets`: calibrated shapes (`tiny`, `llama-3.1-8b-h100`, `llama-3.1-70b-4xh100`)
  with the source of every number.
- `sequence`: `SimRequest` (one sequence: tokens, blocks, timestamps) and the `Channel`
  that wakes its HTTP handler.
- `kvcache`: paged blocks, hash chain over full blocks, LRU reuse of freed blocks,
  the KV events they produce.
- `scheduler`: vLLM V1's step policy (token budget, admission, preemption, LoRA
  limits, remote-KV waits), synchronous and clock-free.
- `latency`: the step-time model.
- `engine`: the async step loop in model time (`clock`).
- `lora`, `pd`, `kv_events`, `chat`, `tokenizer`: adapters, P/D legs, the ZMQ
  publisher, chat rendering and tokens (shared with the EPP).
- `openai`, `metrics`, `server`, `cluster`, `cli`: the vLLM-shaped surface; the server's
  routes by family in `openai_routes`, `admin_routes` and `probe_routes`.
- `loadgen`: measures what N replicas under Poisson load cost (CPU, RSS).

Use `epp sim` from the shell (`epp sim --replicas 3 --port 0` prints one
`sim <name> listening on <url>` line per replica), or in tests:

    async with SimCluster(n=3, config=SimConfig(max_num_seqs=2)) as cluster:
        cluster[0].set_faults(delay_ms=500)   # same as POST /admin {"delay_ms": 500}
        url = cluster[1].url                  # every response: x-sim-server: sim-1

Faults (`POST /admin` with any subset; `GET /admin` shows them with counters):
`delay_ms` (model ms before a request may be scheduled), `fail_rate` (fraction
answered 500), `metrics` (false: /metrics never answers), `healthy` (false: /health
503), `fixed_queue` (int reported as vllm:num_requests_waiting, null to clear).
"""

from epp.sim.cluster import SimCluster
from epp.sim.config import Faults, KVEventsConfig, SimConfig
from epp.sim.presets import config_for
from epp.sim.server import SimServer
from epp.sim.tokenizer import count_tokens

__all__ = [
    "Faults",
    "KVEventsConfig",
    "SimCluster",
    "SimConfig",
    "SimServer",
    "config_for",
    "count_tokens",
]
