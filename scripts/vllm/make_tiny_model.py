"""Write a tiny random-weight Llama and its tokenizer, for a real vLLM on the CPU.

    .venv-vllm/bin/python scripts/vllm/make_tiny_model.py OUT_DIR [--force]

Nothing is downloaded (no hub can be reached from here, shared/REAL_VLLM.md):

- tokenizer: a byte-level BPE trained with `tokenizers` on local text (the docstrings
  of a fixed list of Python standard-library modules, so it does not change with the repo),
  wrapped in `transformers.PreTrainedTokenizerFast`, with a chat template. It adds no
  BOS/EOS of its own (no post-processor), so `encode(text)` gives the same ids whether or
  not special tokens are requested: vLLM (which asks for them on completions) and the
  simulator / EPP (which do not) cut a prompt into exactly the same tokens.
- model: `LlamaConfig(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, ...)`
  — head_dim 64, the only size the CPU attention kernel takes — with random weights
  (seeded), saved as safetensors in float32.
- a LoRA adapter for it in OUT_DIR/lora-adapter (rank 8, random), so a server started
  with `--enable-lora --lora-modules` reports its LoRA metrics.
- a BOS variant in OUT_DIR/bos-variant: the same weights and vocabulary, but a tokenizer
  whose post-processor adds `<s>` (`add_bos_token`) and a chat template that writes
  `{{ bos_token }}` itself, as Llama-family models do. A server on it shows vLLM's BOS
  rule: a completion prompt gets one BOS from the tokenizer, a chat gets one from the
  template and none added on top (the EPP must predict both).

Idempotent: OUT_DIR/.complete marks a finished model; with it present nothing is done
unless --force. Runs with the python of `.venv-vllm` (it has torch, transformers and
tokenizers); takes a few seconds.
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import sys
import warnings
from pathlib import Path

VOCAB_SIZE = 4096
SEED = 0
# Docstrings of these modules are the training text (fixed list: same text every run of
# the same Python).
STDLIB_MODULES = (  # names separated by spaces
    "abc argparse ast asyncio base64 bisect calendar collections colorsys configparser "
    "contextlib copy csv dataclasses datetime decimal difflib email enum fractions "
    "functools gettext glob gzip hashlib heapq hmac html http.client http.server "
    "imaplib inspect io ipaddress itertools json logging mailbox math mimetypes "
    "numbers operator optparse os pathlib pickle pprint queue random re sched "
    "secrets selectors shlex shutil signal smtplib socket sqlite3 statistics string "
    "struct subprocess tarfile tempfile textwrap threading timeit tokenize traceback "
    "typing unittest urllib.parse urllib.request uuid warnings weakref xml.dom.minidom "
    "zipfile zlib"
)

SPECIAL = {"bos": "<s>", "eos": "</s>", "unk": "<unk>", "pad": "<pad>"}
# Rendered by vLLM (jinja) for /v1/chat/completions; the simulator renders the same.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '</s>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


def corpus() -> list[str]:
    warnings.simplefilter("ignore")  # importing some modules warns (deprecations)
    texts: list[str] = []
    for name in STDLIB_MODULES.split():
        try:
            mod = importlib.import_module(name)
        except Exception:  # a module missing from this build of Python: skip it
            continue
        objs = [mod, *(getattr(mod, a, None) for a in sorted(dir(mod)) if not a.startswith("_"))]
        for obj in objs:
            doc = getattr(obj, "__doc__", None)
            if isinstance(doc, str) and doc.strip():
                texts.append(doc)
    if sum(map(len, texts)) < 100_000:
        raise SystemExit(f"make_tiny_model: too little training text ({len(texts)} pieces)")
    return texts


def make_tokenizer(out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=SPECIAL["bos"],
        eos_token=SPECIAL["eos"],
        unk_token=SPECIAL["unk"],
        pad_token=SPECIAL["pad"],
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def make_model(out: Path, tokenizer) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,  # head_dim 64: the CPU attention kernel refuses 16
        num_key_value_heads=1,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)


LORA_DIR = "lora-adapter"  # inside the model directory
LORA_RANK = 8


def make_lora(out: Path, model_dir: Path) -> None:
    """A rank-8 LoRA adapter (q_proj, v_proj) with random weights, in PEFT's layout.

    Written by hand (no `peft` in the vLLM environment): `adapter_config.json` plus
    `adapter_model.safetensors` with `lora_A` (r x in) and `lora_B` (out x r) per module.
    Served with `--enable-lora --lora-modules NAME=PATH`, it makes vLLM report
    `vllm:lora_requests_info` series, which the EPP reads.
    """
    import torch
    from safetensors.torch import save_file

    cfg = json.loads((model_dir / "config.json").read_text())
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    kv_heads = cfg["num_key_value_heads"]
    head_dim = hidden // heads
    shapes = {"q_proj": (hidden, heads * head_dim), "v_proj": (hidden, kv_heads * head_dim)}
    gen = torch.Generator().manual_seed(SEED + 1)
    tensors = {}
    for layer in range(cfg["num_hidden_layers"]):
        for module, (d_in, d_out) in shapes.items():
            key = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(LORA_RANK, d_in, generator=gen) * 0.02
            tensors[f"{key}.lora_B.weight"] = torch.randn(d_out, LORA_RANK, generator=gen) * 0.02
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(model_dir),
        "r": LORA_RANK,
        "lora_alpha": 2 * LORA_RANK,
        "lora_dropout": 0.0,
        "target_modules": sorted(shapes),
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
    }
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")


BOS_DIR = "bos-variant"  # inside the model directory
# The variant's template writes the BOS itself, renders tools and tool calls (JSON through
# the template's `tojson`), and loops over content parts, so vLLM passes it messages in
# the "openai" content format (lists of parts): the paths the EPP must render alike.
BOS_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}<|tools|>\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</s>\n{% endif %}"
    "{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{{ part['text'] }}{% endfor %}{% endif %}"
    "{% if message.tool_calls %}{% for call in message.tool_calls %}"
    "<tool_call>{{ call.function.name }} {{ call.function.arguments | tojson }}</tool_call>"
    "{% endfor %}{% endif %}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def make_bos_variant(model_dir: Path, out: Path) -> None:
    """The BOS variant (see the module doc): JSON edits of the saved tokenizer only."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        if (model_dir / name).is_file():
            shutil.copy2(model_dir / name, out / name)
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    bos = SPECIAL["bos"]
    bos_id = next(t["id"] for t in tok["added_tokens"] if t["content"] == bos)
    tok["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [
            {"SpecialToken": {"id": bos, "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
        ],
        "pair": [
            {"SpecialToken": {"id": bos, "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
            {"Sequence": {"id": "B", "type_id": 1}},
        ],
        "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}},
    }
    (out / "tokenizer.json").write_text(json.dumps(tok))
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    config["add_bos_token"] = True
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "chat_template.jinja").write_text(BOS_CHAT_TEMPLATE)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="directory to write (config, weights, tokenizer)")
    ap.add_argument("--force", action="store_true", help="rewrite even if already complete")
    args = ap.parse_args(argv)
    out: Path = args.out
    done = out / ".complete"
    if done.is_file() and not args.force:
        variant = out / BOS_DIR / "chat_template.jinja"
        if not variant.is_file() or variant.read_text() != BOS_CHAT_TEMPLATE:  # older model
            make_bos_variant(out, out / BOS_DIR)
        print(f"tiny model: {out} already complete")
        return 0
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    tokenizer = make_tokenizer(out)
    make_model(out, tokenizer)
    make_lora(out / LORA_DIR, out)
    make_bos_variant(out, out / BOS_DIR)
    if not (out / "tokenizer.json").is_file():
        raise SystemExit(f"make_tiny_model: no tokenizer.json written in {out}")
    sample = "def routing(request): return the best endpoint"
    summary = {
        "vocab_size": len(tokenizer),
        "sample_ids": tokenizer.encode(sample),
        "sample_ids_no_special": tokenizer.encode(sample, add_special_tokens=False),
    }
    if summary["sample_ids"] != summary["sample_ids_no_special"]:
        raise SystemExit("make_tiny_model: the tokenizer adds special tokens; it must not")
    done.write_text(json.dumps(summary) + "\n")
    print(f"tiny model: wrote {out} (vocab {len(tokenizer)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
