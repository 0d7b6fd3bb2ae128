"""The agent scenario (bench/routing_agent.py): sessions that grow by one tool result per
turn, half over /v1/messages, routed by the EPP's Director in virtual time."""

from __future__ import annotations

import itertools
from collections import defaultdict

from tests.unit.test_routing_virtual import rv, scenario  # noqa: F401  (fixture)


def test_agent_sessions_grow_turn_by_turn_half_over_messages(rv, tmp_path):  # noqa: F811
    args, reqs = scenario(rv, "agent", tmp_path)
    assert args.agent and reqs
    by_session: dict[str, list] = defaultdict(list)
    for r in reqs:
        key = (r.headers or {}).get("x-claude-code-session-id") or r.headers["session-id"]
        by_session[key].append(r)
        assert r.path == (
            "/v1/messages" if "x-claude-code-session-id" in r.headers else "/v1/chat/completions"
        )
    assert {r.path for r in reqs} == {"/v1/messages", "/v1/chat/completions"}
    for turns in by_session.values():
        for before, after in itertools.pairwise(turns):
            # each turn is the previous prompt plus one tool result of 200-2,000 tokens
            assert after.prompt.startswith(before.prompt)
            assert 200 <= len(after.prompt.split()) - len(before.prompt.split()) <= 2000
            assert after.previous == len(before.prompt.split())


def test_the_agent_config_keeps_sessions_where_their_context_is(rv, tmp_path):  # noqa: F811
    args, reqs = scenario(rv, "agent", tmp_path)
    agent = rv.routing_module().agent_module()
    ideal = agent.ideal_hit_rate(reqs)
    rr = rv.summarize("rr", rv.run("rr", args, reqs, 1), args)
    sticky = rv.summarize("epp-agent", rv.run("epp-agent", args, reqs, 1), args)

    def hits(rows: list[dict]) -> float:
        return sum(r["hit_rate"] or 0 for r in rows) / len(rows)

    # 3 servers pushed past capacity here: well above round-robin, near the ideal
    assert ideal > 0.5
    assert hits(sticky) > hits(rr) + 0.2
    assert hits(sticky) > 0.8 * ideal


def test_ideal_hit_rate_counts_whole_blocks_of_the_previous_context():
    from bench import routing_agent as agent

    class R:
        def __init__(self, words: int, previous: int) -> None:
            self.prompt, self.previous, self.stage = " ".join(["w"] * words), previous, 0

    # 100 tokens after 40: 32 cached (two whole 16-token blocks); 50 after 0: none
    assert agent.ideal_hit_rate([R(100, 40), R(50, 0)]) == 32 / 150
