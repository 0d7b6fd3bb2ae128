"""A vLLM-compatible model-server simulator: OpenAI endpoints, vLLM's Prometheus
metrics and a queueing/latency model, cheap enough to run many replicas in one process.

Use `epp sim` from the shell, or in tests:

    async with SimCluster(n=3, config=SimConfig(max_num_seqs=2)) as cluster:
        cluster[0].set_faults(delay_ms=500)
        url = cluster[1].url
"""

from epp.sim.cluster import SimCluster
from epp.sim.config import Faults, SimConfig
from epp.sim.server import SERVER_HEADER, SimServer
from epp.sim.tokenizer import count_tokens

__all__ = ["SERVER_HEADER", "Faults", "SimCluster", "SimConfig", "SimServer", "count_tokens"]
