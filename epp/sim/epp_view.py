"""What the EPP sees of virtual-time engines: the last scrape, plus its own in-flight
counts, at a given instant. The virtual-time benchmarks (`bench/predictor_accuracy.py`,
`bench/slo_virtual.py`) feed these snapshots to the real scheduler, so the view must lag
the engines exactly as a live EPP's does.
"""

from __future__ import annotations

from epp.datastore import Endpoint, EndpointMetrics, EndpointSnapshot
from epp.sim.virtual import Finished, VirtualEngine


def scrape(engines: list, now: float) -> list[EndpointMetrics]:
    """What a scrape of every engine would read at `now` (the EPP's stale view until
    the next one)."""
    out = []
    for eng in engines:
        ld = eng.load()
        out.append(
            EndpointMetrics(
                waiting_queue_size=ld.waiting,
                running_requests=ld.running,
                kv_cache_usage=ld.kv_usage,
                update_time=now,
            )
        )
    return out


def epp_view(
    engines: list[VirtualEngine],
    scraped: list[EndpointMetrics],
    pending: dict,
    now: float,
    held: list[list[Finished]],
) -> list[EndpointSnapshot]:
    """What a scheduling cycle would see at `now`: last scrape + the EPP's in-flight counts.

    `advance_to(now)` carries out the step in progress whole (its tokens stamped with its
    end, after `now`), so the engine's state is a little ahead of the EPP's: a prompt whose
    prefill step is running already has its first token, and a request in its last step is
    already finished. The EPP only learns of either when the token arrives, so a request
    counts as in flight until its `finish` (`held`: finished in the engine, not yet by
    `now`) and its prompt as pending prefill until its `first_token`. (Before this, a
    long prompt's 300-600 ms prefill step vanished from the view the moment it started,
    and a chat routed behind it was predicted at ~20 ms: docs/BENCHMARKS.md@a73a134 "What limits
    the predictor".) `pending[rid]` has the request's `isl` and `osl` as the EPP counts
    them, and its `arrival` (when it was routed: the oldest pending one's is
    `oldest_pending_at`)."""
    reqs = [0] * len(engines)
    prefill = [0] * len(engines)
    tokens = [0] * len(engines)
    oldest: list[float | None] = [None] * len(engines)
    for i, eng in enumerate(engines):
        s = eng.scheduler
        live = [(r.rid, r.first_token_at) for r in (*s.waiting, *s.running, *s.transferring)]
        live += [(f.rid, f.first_token) for f in held[i]]
        for rid, first in live:
            p = pending[rid]
            reqs[i] += 1
            tokens[i] += p.osl  # expected output, held until the end
            if first is None or first > now:  # no first token yet: prefill pending
                prefill[i] += p.isl
                tokens[i] += p.isl
                at = oldest[i]
                oldest[i] = p.arrival if at is None else min(at, p.arrival)
    return [
        EndpointSnapshot(
            Endpoint(f"e{i}", "10.0.0.1", 8000 + i),
            scraped[i],
            inflight_requests=reqs[i],
            inflight_tokens=tokens[i],
            inflight_prefill_tokens=prefill[i],
            oldest_pending_at=oldest[i],
        )
        for i in range(len(engines))
    ]


def finished_by(engines: list[VirtualEngine], held: list[list[Finished]], now: float) -> list:
    """(engine index, Finished) of the requests whose last token came by `now`, in finish
    order; the ones the engine finished ahead of `now` stay in `held` until then."""
    out = []
    for i, eng in enumerate(engines):
        eng.advance_to(now)
        held[i].extend(eng.drain_finished())
        out += [(i, f) for f in held[i] if f.finish <= now]
        held[i] = [f for f in held[i] if f.finish > now]
    out.sort(key=lambda x: x[1].finish)
    return out
