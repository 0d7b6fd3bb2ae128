"""A vLLM-compatible model-server simulator: OpenAI endpoints, vLLM's Prometheus
metrics and a queueing/latency model, cheap enough to run many replicas in one process.

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
from epp.sim.config import Faults, SimConfig
from epp.sim.server import SERVER_HEADER, SimServer
from epp.sim.tokenizer import count_tokens

__all__ = ["SERVER_HEADER", "Faults", "SimCluster", "SimConfig", "SimServer", "count_tokens"]
