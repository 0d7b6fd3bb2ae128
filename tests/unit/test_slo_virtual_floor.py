"""bench/slo_virtual.py's floor: a request alone on an idle server takes its own prefill,
the least TTFT any router could give it (the bound the SLO benchmark reports)."""

from bench.slo_virtual import isolated_ttft
from epp.sim.config import SimConfig


def test_isolated_ttft_is_the_prompt_prefill_on_an_idle_server():
    fast = SimConfig(
        decode_ms_per_token=10.0,
        prefill_ms_per_token=0.2,
        max_num_seqs=4,
        enable_prefix_caching=False,
    )
    assert isolated_ttft(fast, 1500) == 300.0  # 1,500 tokens × 0.2 ms
    assert isolated_ttft(fast, 40) == 8.0
