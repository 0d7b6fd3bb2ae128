"""The virtual-time benches' view of the EPP (`epp.sim.epp_view`, used by
bench/predictor_accuracy.py and bench/slo_virtual.py) must not see the future.

`VirtualEngine.advance_to(t)` carries out the step in progress whole, so the engine's
state at `t` already holds that step's tokens, stamped with the step's end. The EPP learns
of a first token or of the end of a response only when it happens; before this was
modelled, a long prompt's prefill vanished from the in-flight prefill count the moment its
step started, and the latency predictor saw an idle endpoint behind a 300 ms step."""

from types import SimpleNamespace

from epp.datastore import EndpointMetrics
from epp.sim.config import SimConfig
from epp.sim.epp_view import epp_view, finished_by
from epp.sim.virtual import VirtualEngine

# 0.2 ms per prefill token, 10 ms per decode step, no other step cost: a 1,500-token
# prompt's prefill step runs 0 → 300 ms (first token at 0.3 s), its second and last
# token comes one decode step later, at 0.31 s.
CONFIG = SimConfig(
    decode_ms_per_token=10.0,
    prefill_ms_per_token=0.2,
    max_num_seqs=4,
    enable_prefix_caching=False,
)


def view_at(engine, pending, held, now):
    finished = finished_by([engine], held, now)
    (snap,) = epp_view([engine], [EndpointMetrics()], pending, now, held)
    return snap, finished


def test_a_running_prefill_step_stays_pending_until_its_first_token():
    engine = VirtualEngine(CONFIG)
    pending = {0: SimpleNamespace(isl=1500, osl=2, arrival=0.0)}
    held = [[]]
    engine.add(0, 1500, 2, 0.0)
    snap, finished = view_at(engine, pending, held, 0.1)
    # the engine has already run the 0-300 ms step (its first token is stamped 0.3 s) ...
    (req,) = engine.scheduler.running
    assert req.first_token_at is not None and abs(req.first_token_at - 0.3) < 1e-9
    # ... but at 0.1 s the EPP still holds its 1,500 prompt tokens as pending prefill
    assert (snap.inflight_requests, snap.inflight_prefill_tokens) == (1, 1500)
    assert snap.inflight_tokens == 1500 + 2  # prompt pending + expected output
    assert snap.oldest_pending_at == 0.0  # routed at 0, no first byte yet
    assert finished == []


def test_a_response_finished_ahead_of_now_stays_in_flight_until_its_end():
    engine = VirtualEngine(CONFIG)
    pending = {0: SimpleNamespace(isl=1500, osl=2, arrival=0.0)}
    held = [[]]
    engine.add(0, 1500, 2, 0.0)
    # 0.305 s: the decode step 0.30-0.31 s has started, so the engine has finished the
    # request (finish 0.31 s); the EPP has its first token (0.3 s) but not its end yet.
    snap, finished = view_at(engine, pending, held, 0.305)
    assert finished == []
    assert [f.rid for f in held[0]] == [0]
    assert snap.oldest_pending_at is None  # its first byte came at 0.3 s
    assert (snap.inflight_requests, snap.inflight_prefill_tokens, snap.inflight_tokens) == (
        1,
        0,
        2,
    )
    # 0.32 s: the response has ended; it is handed back once and leaves the view
    snap, finished = view_at(engine, pending, held, 0.32)
    assert [(i, f.rid, round(f.finish, 6)) for i, f in finished] == [(0, 0, 0.31)]
    assert held == [[]]
    assert (snap.inflight_requests, snap.inflight_tokens) == (0, 0)
