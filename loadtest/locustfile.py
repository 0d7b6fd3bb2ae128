"""Load tests with locust: the workloads users run against an EPP-fronted pool.

Point it at any OpenAI-compatible gateway (Envoy + `epp serve` in front of vLLM or
`epp sim`); `make load` starts a local pool and runs it headless (`epp/harness/load.py`).

    locust -f loadtest/locustfile.py --host http://127.0.0.1:8081 \
        --headless -u 16 -r 4 -t 60s --csv load-report/locust --html load-report/report.html

Four user classes, run together by weight (name some on the command line to run only
those, e.g. `... SharedPrefixChat LongPrompt`):

- `SharedPrefixChat` (4): multi-turn streamed chat; every user keeps one of
  `--system-prompts` long system prompts (the shared prefix a prefix-aware config should
  keep on one server) and its conversation grows turn by turn.
- `LoraMix` (2): completions for the base model and each of `--lora-adapters` in turn,
  alternating streamed and plain.
- `LongPrompt` (1): one-shot streamed completions of `--long-prompt-words` words.
- `StreamingCompletion` (2): short prompts, `--stream-max-tokens` tokens streamed back.

Every streamed request also records, as locust metrics of request type `METRIC` (they
appear in the CSV, the HTML report and the console like requests):
`TTFT` (request sent → first chunk carrying a token, ms), `ITL` (the mean gap between
later token chunks of that request, ms) and `E2E` (request sent → last token, ms). For a
streamed request locust's own response time (its POST row) ends at the response headers.
A streamed response that is not 200, carries an `error` event or never ends with
`[DONE]` is a failure.
"""

from __future__ import annotations

import json
import random
import time
from typing import Any

from locust import HttpUser, between, events, task

WORDS = (
    "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa",
    "lambda", "mu", "nu", "xi", "omicron", "pi", "rho", "sigma", "tau", "upsilon", "phi",
    "chi", "psi", "omega",
)  # fmt: skip


@events.init_command_line_parser.add_listener
def _options(parser: Any) -> None:
    group = parser.add_argument_group("epp workloads")
    group.add_argument("--model", default="tiny", env_var="EPP_LOAD_MODEL", help="base model")
    group.add_argument(
        "--lora-adapters",
        default="",
        env_var="EPP_LOAD_LORA_ADAPTERS",
        help="comma-separated adapter names the pool serves (LoraMix); empty = base only",
    )
    group.add_argument(
        "--system-prompts",
        type=int,
        default=4,
        env_var="EPP_LOAD_SYSTEM_PROMPTS",
        help="distinct shared system prompts (SharedPrefixChat)",
    )
    group.add_argument(
        "--system-prompt-words", type=int, default=600, env_var="EPP_LOAD_SYSTEM_PROMPT_WORDS"
    )
    group.add_argument(
        "--long-prompt-words", type=int, default=3000, env_var="EPP_LOAD_LONG_PROMPT_WORDS"
    )
    group.add_argument("--max-tokens", type=int, default=16, env_var="EPP_LOAD_MAX_TOKENS")
    group.add_argument(
        "--stream-max-tokens", type=int, default=64, env_var="EPP_LOAD_STREAM_MAX_TOKENS"
    )


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def system_prompt(i: int, n_words: int) -> str:
    """The i-th shared system prompt: the same text in every user and every run."""
    return f"System prompt {i}. " + words(random.Random(i), n_words)


def record(user: HttpUser, name: str, ms: float) -> None:
    """One sample of a derived metric (TTFT, ITL) in locust's statistics."""
    user.environment.events.request.fire(
        request_type="METRIC",
        name=name,
        response_time=ms,
        response_length=0,
        exception=None,
        context={},
    )


def _carries_token(payload: bytes) -> bool:
    """An SSE data line with generated text (completions `text`, chat `delta.content`)."""
    try:
        event = json.loads(payload)
    except ValueError:
        return False
    for choice in event.get("choices") or ():
        if choice.get("text") or (choice.get("delta") or {}).get("content"):
            return True
    return False


def stream(user: HttpUser, path: str, body: dict[str, Any], name: str) -> None:
    """POST a streamed request; record TTFT and ITL; fail it unless it ends with [DONE]."""
    body = {**body, "stream": True}
    start = time.perf_counter()
    token_times: list[float] = []
    with user.client.post(path, json=body, stream=True, catch_response=True, name=name) as r:
        if r.status_code != 200:
            r.failure(f"HTTP {r.status_code}: {r.text[:200]}")
            return
        done = False
        for line in r.iter_lines():
            if not line.startswith(b"data: "):
                continue
            payload = line[6:]
            if payload == b"[DONE]":
                done = True
                break
            if b'"error"' in payload:
                r.failure(f"error event: {payload[:200]!r}")
                return
            if _carries_token(payload):
                token_times.append(time.perf_counter())
        if not done:
            r.failure("stream ended without [DONE]")
            return
        if not token_times:
            r.failure("no token in the stream")
            return
        r.success()
    record(user, "TTFT", (token_times[0] - start) * 1000)
    record(user, "E2E", (token_times[-1] - start) * 1000)
    if len(token_times) > 1:
        itl = (token_times[-1] - token_times[0]) / (len(token_times) - 1)
        record(user, "ITL", itl * 1000)


def plain(user: HttpUser, path: str, body: dict[str, Any], name: str) -> None:
    with user.client.post(path, json=body, catch_response=True, name=name) as r:
        if r.status_code != 200:
            r.failure(f"HTTP {r.status_code}: {r.text[:200]}")
        elif not r.json().get("choices"):
            r.failure("no choices in the answer")
        else:
            r.success()


class EppUser(HttpUser):
    abstract = True
    wait_time = between(0.05, 0.3)

    @property
    def opts(self) -> Any:
        return self.environment.parsed_options

    def on_start(self) -> None:
        self.rng = random.Random()


class SharedPrefixChat(EppUser):
    weight = 4

    def on_start(self) -> None:
        super().on_start()
        self.new_conversation()

    def new_conversation(self) -> None:
        i = self.rng.randrange(self.opts.system_prompts)
        self.messages = [
            {"role": "system", "content": system_prompt(i, self.opts.system_prompt_words)}
        ]

    @task
    def chat_turn(self) -> None:
        if len(self.messages) > 9:  # 4 turns, then a new conversation
            self.new_conversation()
        self.messages.append({"role": "user", "content": words(self.rng, 20)})
        body = {"model": self.opts.model, "messages": self.messages}
        stream(self, "/v1/chat/completions", {**body, "max_tokens": self.opts.max_tokens}, "chat")
        self.messages.append({"role": "assistant", "content": words(self.rng, 12)})


class LoraMix(EppUser):
    weight = 2

    def on_start(self) -> None:
        super().on_start()
        adapters = [a for a in self.opts.lora_adapters.split(",") if a]
        self.models = [self.opts.model, *adapters]
        self.turn = self.rng.randrange(len(self.models))

    @task
    def completion(self) -> None:
        self.turn += 1
        model = self.models[self.turn % len(self.models)]
        body = {"model": model, "prompt": words(self.rng, 40), "max_tokens": self.opts.max_tokens}
        name = f"lora:{model}"
        if self.turn % 2:
            stream(self, "/v1/completions", body, name)
        else:
            plain(self, "/v1/completions", body, name)


class LongPrompt(EppUser):
    weight = 1

    @task
    def long_completion(self) -> None:
        body = {
            "model": self.opts.model,
            "prompt": words(self.rng, self.opts.long_prompt_words),
            "max_tokens": self.opts.max_tokens,
        }
        stream(self, "/v1/completions", body, "long-prompt")


class StreamingCompletion(EppUser):
    weight = 2

    @task
    def streamed(self) -> None:
        body = {
            "model": self.opts.model,
            "prompt": words(self.rng, 12),
            "max_tokens": self.opts.stream_max_tokens,
        }
        stream(self, "/v1/completions", body, "stream")
