"""Per-request cost of turning a chat request into the server's token ids.

Run: `.venv/bin/python bench/prompt_render.py [--model DIR]` (about half a minute).
DIR is a model directory with tokenizer.json and a chat template; by default the tiny
model of the real-vLLM tier (`.venv-vllm/models/tiny-llama`, `make test-vllm` writes it),
else a byte-level BPE trained here on this file's text, with that model's template.

CPU time (not wall time) per request, medians, measured side by side in one process on
the same requests (a multi-turn chat of about N tokens: a long system prompt, then
alternating user/assistant turns):

- before: the plain rendering (`epp.request.render_chat`) tokenized — once per producer
  that needs ids (approx and precise in one EPP: twice);
- template: the model's template rendered as vLLM does (`epp.chat_template`) and
  tokenized, once;
- shared: what a second producer pays for the same request (`epp.prompt_tokens`'s
  CycleState lookup).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from epp.prompt_tokens import prompt_token_ids
from epp.request import new_request, parse_body
from epp.scheduling.types import CycleState
from epp.tokenizer import HFTokenizer

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = REPO / ".venv-vllm" / "models" / "tiny-llama"
TEMPLATE = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + message['content'] "
    "+ '</s>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
SENTENCE = (
    "The endpoint picker routes each request to the model server that already holds the "
    "longest prefix of its prompt, weighed against queue length and cache pressure. "
)


def local_model(d: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=2000,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([Path(__file__).read_text()] * 5, trainer)
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    (d / "chat_template.jinja").write_text(TEMPLATE)
    return d


def chat_body(tokens: int, turns: int) -> bytes:
    # ~30 tokens per SENTENCE with these tokenizers; the system prompt takes ~3/4.
    system = SENTENCE * max(1, (tokens * 3 // 4) // 30)
    messages = [{"role": "system", "content": system}]
    for i in range(turns):
        role = "user" if i % 2 == 0 else "assistant"
        messages.append({"role": role, "content": f"turn {i}: " + SENTENCE * 2})
    return json.dumps({"model": "m", "messages": messages, "max_tokens": 16}).encode()


def median_us(fn, n: int) -> float:
    """Median CPU time per call (process time: on a loaded shared machine wall time is
    mostly waiting for a core, several times the work itself)."""
    times = []
    for _ in range(n):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--iterations", type=int, default=300)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or (DEFAULT_MODEL if DEFAULT_MODEL.is_dir() else local_model(Path(tmp)))
        tok = HFTokenizer(model)
        assert tok.chat_template is not None, f"{model} has no chat template"
        print(f"model {model}")
        print("CPU time per request, median of", args.iterations)
        print("prompt tokens | before: plain x2 (us) | template x1 (us) | shared read (us) | ratio")
        for tokens, turns in ((512, 4), (4096, 10), (16384, 20)):
            raw = chat_body(tokens, turns)
            req = parse_body(new_request({}, "/v1/chat/completions", "POST"), raw)
            n = len(prompt_token_ids(None, req, tok))

            def before(req=req):
                tok.encode(req.prompt_text)
                tok.encode(req.prompt_text)

            def template(req=req):
                prompt_token_ids(CycleState(), req, tok)

            state = CycleState()
            prompt_token_ids(state, req, tok)

            def shared(req=req, state=state):
                prompt_token_ids(state, req, tok)

            b = median_us(before, args.iterations)
            t = median_us(template, args.iterations)
            s = median_us(shared, args.iterations)
            print(f"{n:13} | {b:21.0f} | {t:16.0f} | {s:16.2f} | {t / b:.2f}")


if __name__ == "__main__":
    main()
