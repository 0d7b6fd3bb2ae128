"""Min–max scoring shared by the queue and running-requests scorers.

Upstream: score = (max − x) / (max − min) across the candidates; all equal → 1.0.
"""

from __future__ import annotations

from collections.abc import Sequence


def min_max_inverted(values: Sequence[float]) -> list[float]:
    if not values:
        return []
    lo, hi = min(values), max(values)
    if hi == lo:
        return [1.0] * len(values)
    span = hi - lo
    return [(hi - v) / span for v in values]
