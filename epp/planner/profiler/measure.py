"""From token arrival times to the two decode numbers: steady ITL and tokens per second.

Both the HTTP sweep (SSE chunk times on the client) and the virtual profile (step end
times in the simulator's scheduler) hand over one list of token times per stream, in
seconds, first token first. Dynamo measures with AIPerf over whole requests; here the
ITL is taken over the **steady part** only: from the moment the last stream received
its first token to the moment the first stream received its last, when exactly the
intended number of streams decode together. Stragglers at the start (streams whose
prefill landed a step later) and the tail (streams finishing early) would otherwise
mix smaller batches into the number.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DecodeTiming:
    itl_ms: float  # mean time between consecutive tokens of one stream
    tokens_per_s: float  # output tokens of all streams per second, over the same part
    steady: bool  # False: the streams never decoded all together; whole streams used
    # The server's own view, if it exports one (vLLM's inter-token histogram over the
    # measured streams): tells client/network overhead from the engine's step time.
    server_itl_ms: float | None = None


@dataclass(frozen=True, slots=True)
class PrefillTiming:
    ttft_ms: float  # client side: request sent -> first token chunk received
    server_ttft_ms: float | None = None  # the server's TTFT histogram, same request


def steady_decode(streams: Sequence[Sequence[float]]) -> DecodeTiming:
    """Token-weighted mean ITL and aggregate output rate over the steady part.

    Falls back to whole streams (first to last token of each) when the streams never
    overlap fully or the overlap holds fewer than two gaps, e.g. when the server runs
    fewer sequences at once than were sent (its `max_num_seqs`).
    """
    streams = [s for s in streams if len(s) >= 2]
    if not streams:
        raise ValueError("no stream produced two tokens: cannot measure an ITL")
    start = max(s[0] for s in streams)
    end = min(s[-1] for s in streams)
    if end > start:
        gaps, spent = 0, 0.0
        for s in streams:
            inside = [t for t in s if start <= t <= end]
            if len(inside) >= 2:
                gaps += len(inside) - 1
                spent += inside[-1] - inside[0]
        if gaps >= 2 and spent > 0:
            return DecodeTiming(1000 * spent / gaps, gaps / (end - start), True)
    gaps = sum(len(s) - 1 for s in streams)
    spent = sum(s[-1] - s[0] for s in streams)
    span = max(s[-1] for s in streams) - min(s[0] for s in streams)
    if spent <= 0 or span <= 0:
        raise ValueError("all tokens arrived at the same instant: cannot measure an ITL")
    return DecodeTiming(1000 * spent / gaps, gaps / span, False)


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        raise ValueError("median of nothing")
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2
