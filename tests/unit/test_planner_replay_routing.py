"""The replay routes as the EPP does: at every pick of a replay (shared prefixes, a pool
that grows and drains), a scheduler loaded the way `epp serve` loads config/default.yaml
is handed the same snapshot and request, and must pick the same endpoint."""

from __future__ import annotations

import random
from pathlib import Path

from epp.composition import install_plugins
from epp.config.loader import load_config_file
from epp.director import Director
from epp.planner.offline.pool import PoolShape, Routing
from epp.planner.offline.replay import replay
from epp.planner.offline.routing import EppRouter
from epp.scheduling.registry import Handle
from epp.sim import presets
from tests.unit.test_planner_replay_golden import Steps, trace

ROOT = Path(__file__).resolve().parents[2]
SEED = 4


def test_the_replay_picks_what_the_live_scheduler_picks_on_the_same_snapshot(monkeypatch):
    install_plugins()
    live = load_config_file(ROOT / "config" / "default.yaml", Handle(rng=random.Random(SEED)))
    picks: list[tuple[str, str]] = []
    original = Director.route

    def route(self, request, subset, state=None):
        candidates = self.candidates(request, subset)
        theirs = live.scheduler.schedule(request, candidates)
        for hook in live.pre_request:  # the live index learns where its pick went
            hook.pre_request(request, theirs)
        decision = original(self, request, subset, state)
        picks.append((decision.result.primary.targets[0].name, theirs.primary.targets[0].name))
        return decision

    monkeypatch.setattr(Director, "route", route)
    text = (ROOT / "config" / "default.yaml").read_text()
    shape = PoolShape(
        presets.config_for("llama-3.1-8b-h100"),
        startup_s=2.0,
        routing=Routing(text, "config/default.yaml"),
    )
    run = replay(trace(800), Steps([5, 2, 4]), shape, initial=2, seed=SEED)
    assert len(picks) == 800 and len(run.served) == 800
    assert all(ours == theirs for ours, theirs in picks)
    assert len({p for p, _ in picks}) >= 4  # the pool grew, and the picks spread
    assert sum(s.cached_tokens for s in run.served) > 0  # prefixes did stick


def test_prompts_share_blocks_exactly_where_the_trace_says():
    router = EppRouter.__new__(EppRouter)
    router.block_tokens = 32
    a = router._prompt(1, 100, (7, 8, 9))
    b = router._prompt(2, 80, (7, 8))
    c = router._prompt(3, 100, (7, 5, 9))
    d = router._prompt(4, 40, ())
    assert a[:64] == b[:64] and a[64] != b[64]  # two shared blocks, then b's own tail
    assert a[:32] == c[:32] and a[32] != c[32]
    assert d[0] != a[0] and len(d) == 40 and len(a) == 100


def test_a_bad_config_is_one_line_and_exit_2_before_any_replay(tmp_path, capsys):
    from epp.cli import main

    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5}\n')
    bad = tmp_path / "bad.yaml"
    bad.write_text("plugins:\n- type: no-such-scorer\n")
    code = main(["plan", "replay", "--quiet", "--trace", str(trace), "--config", str(bad)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "no-such-scorer" in err
    code = main(["plan", "replay", "--quiet", "--trace", str(trace), "--config", "/nope.yaml"])
    err = capsys.readouterr().err
    assert code == 2 and "--config /nope.yaml: cannot read" in err
