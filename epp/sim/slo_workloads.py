"""A seeded family of SLO routing workloads (pool speed, load, chat/long mix and their
TTFT/TPOT targets), split into a tuning half and a reporting half.

One workload is a single point: a config tuned on it can lose on the next pool or mix, so
defaults are chosen on the tuning half and judged on the reporting half only. The family
is pure data, the same on every machine; `bench/slo_family.py` runs the EPP over it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

FAMILY_SEED = 27
SPLIT_SEED = 2027
FAMILY_SIZE = 12
CLASSES = ("chat", "long")


@dataclass(frozen=True)
class SloWorkload:
    """One pool and mix; the field names are `add_workload_args`' option names."""

    name: str
    seed: int  # arrivals and prompts (run k uses seed + k)
    load: float  # offered rate / the pool's capacity
    slow_factor: float
    slow_count: int
    chat_share: float
    chat_words: int
    chat_out: int
    chat_ttft_ms: float
    chat_tpot_ms: float
    long_words: int
    long_out: int
    long_ttft_ms: float


def family(seed: int = FAMILY_SEED, size: int = FAMILY_SIZE) -> list[SloWorkload]:
    """`size` workloads drawn from `seed` (the same list on every machine and run)."""
    rng = random.Random(seed)
    out = []
    for i in range(size):
        out.append(
            SloWorkload(
                name=f"w{i:02d}",
                seed=1000 + 10 * i,
                load=round(rng.uniform(0.4, 0.9), 2),
                slow_factor=round(rng.uniform(1.5, 3.0), 2),
                slow_count=rng.choice((1, 1, 2)),
                chat_share=round(rng.uniform(0.5, 0.9), 2),
                chat_words=rng.randint(20, 120),
                chat_out=rng.randint(8, 48),
                chat_ttft_ms=float(rng.choice((100, 150, 200, 300))),
                chat_tpot_ms=float(rng.choice((20, 25, 30, 40, 50))),
                long_words=rng.randint(800, 2500),
                long_out=rng.randint(16, 64),
                long_ttft_ms=float(rng.choice((1000, 1500, 2000, 3000))),
            )
        )
    return out


def split(workloads: list[SloWorkload], seed: int = SPLIT_SEED) -> dict[str, list[SloWorkload]]:
    """Half the workloads for tuning, the other half for reporting, chosen by `seed`."""
    names = sorted(w.name for w in workloads)
    tuning = set(random.Random(seed).sample(names, len(names) // 2))
    return {
        "tuning": [w for w in workloads if w.name in tuning],
        "reporting": [w for w in workloads if w.name not in tuning],
    }
