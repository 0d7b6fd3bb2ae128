"""Min–max scoring shared by the queue and running-requests scorers.

Upstream: score = (max − x) / (max − min) across the candidates; all equal → 1.0.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# From this many values numpy is cheaper than the Python comprehension (see
# epp/scheduling/profile.py VECTOR_MIN_ENDPOINTS); the same IEEE operations either way.
_VECTOR_MIN = 64


def min_max_inverted(values: Sequence[float]) -> list[float]:
    if not values:
        return []
    if len(values) >= _VECTOR_MIN:
        arr = np.asarray(values, dtype=np.float64)
        lo, hi = arr.min(), arr.max()
        if hi == lo:
            return [1.0] * len(values)
        return ((hi - arr) / (hi - lo)).tolist()
    lo, hi = min(values), max(values)
    if hi == lo:
        return [1.0] * len(values)
    span = hi - lo
    return [(hi - v) / span for v in values]
