"""The `agent` scenario of `epp bench routing`: coding-agent sessions, half of them over
Anthropic's Messages API.

A session is a system prompt (`--system-tokens`) and 10-40 turns; each turn is the
assistant calling a tool and the tool's result, 200-2,000 tokens, appended to the
context, so a session's last request carries 10-60k tokens and every request repeats the
previous one plus one turn (llm-d's agent traces: nearly every turn reuses almost all of
its prefix). `--groups` sessions run at once; a session that has had all its turns is
replaced by a new one. Even sessions speak `/v1/chat/completions` (an assistant message
with a tool call, then a `tool` message), odd ones `/v1/messages` (an assistant
`tool_use` block, then a user `tool_result` block), with the session's id in the header
agent clients send (`x-claude-code-session-id`; `session-id` for chat, as Codex).

`ideal_hit_rate` is the pool-wide prefix-hit rate with unlimited KV cache and perfect
stickiness: every request hits its session's previous context in whole blocks.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass

BLOCK = 16  # the simulator preset's KV block size


@dataclass
class Session:
    sid: int
    system: str
    turns: int
    results: list[str]


class AgentPrompts:
    def __init__(self, args: argparse.Namespace, rng: random.Random, words) -> None:
        self.args, self.rng, self.words = args, rng, words
        self.next_sid = 0
        self.slots = [self.new_session() for _ in range(max(1, args.groups))]

    def new_session(self) -> Session:
        sid = self.next_sid
        self.next_sid += 1
        system = f"agent{sid:05d} " + self.words(self.rng, self.args.system_tokens - 1)
        return Session(sid, system, self.rng.randint(10, 40), [])

    def next(self) -> tuple[str, str, dict, dict[str, str], int]:
        """(engine prompt, path, body, headers, tokens the previous turn had)."""
        g = self.rng.randrange(len(self.slots))
        s = self.slots[g]
        if len(s.results) == s.turns:
            s = self.slots[g] = self.new_session()
        previous = prompt_tokens(s)
        size = self.rng.randint(200, 2000)
        s.results.append(f"r{len(s.results)} " + self.words(self.rng, size - 1))
        prompt = " ".join([s.system, *s.results])
        if s.sid % 2:
            path, body = "/v1/messages", messages_body(s)
            headers = {"x-claude-code-session-id": f"session-{s.sid}"}
        else:
            path, body = "/v1/chat/completions", chat_body(s)
            headers = {"session-id": f"session-{s.sid}"}
        return prompt, path, body, headers, previous


def prompt_tokens(s: Session) -> int:
    return 0 if not s.results else len(" ".join([s.system, *s.results]).split())


def chat_body(s: Session) -> dict:
    messages: list[dict] = [{"role": "system", "content": s.system}]
    for k, result in enumerate(s.results):
        call = {"id": f"c{k}", "type": "function", "function": {"name": "run", "arguments": "{}"}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{k}", "content": result})
    return {"messages": messages}


def messages_body(s: Session) -> dict:
    messages: list[dict] = []
    for k, result in enumerate(s.results):
        use = {"type": "tool_use", "id": f"c{k}", "name": "run", "input": {}}
        messages.append({"role": "assistant", "content": [use]})
        done = {"type": "tool_result", "tool_use_id": f"c{k}", "content": result}
        messages.append({"role": "user", "content": [done]})
    return {"system": s.system, "messages": messages}


def ideal_hit_rate(reqs: list) -> float:
    """Hits / prompt tokens if each request found its session's previous context cached
    (whole blocks, as vLLM counts them; never the last prompt token)."""
    hits = total = 0
    for r in reqs:
        if r.stage < 0:
            continue
        n = len(r.prompt.split())
        total += n
        hits += min(r.previous // BLOCK, (n - 1) // BLOCK) * BLOCK
    return hits / total if total else 0.0
