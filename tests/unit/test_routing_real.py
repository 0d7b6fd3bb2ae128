"""bench/routing_real.py's pure parts: the servers' command line (through the real
scripts/vllm/serve.py `--print`), the EPP configs it derives from config/ (loaded by the
EPP's own loader), and the medians over repeated runs. No vLLM is started here."""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bench import routing_real
from epp.config.loader import load_config_text

ROOT = Path(__file__).resolve().parents[2]


def load():
    return routing_real


@pytest.fixture()
def model_dir(tmp_path: Path) -> str:
    """A directory with a real (tiny, locally trained) tokenizer.json, as a model's."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["[UNK]"])
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 50, trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    return str(tmp_path)


def args_for(model_dir: str) -> argparse.Namespace:
    return argparse.Namespace(
        python=sys.executable, model_dir=model_dir, max_model_len=1024, num_blocks=64
    )


def test_each_server_binds_its_kv_publisher_and_serves_the_render_routes(model_dir) -> None:
    rr = load()
    argv = rr.server_argv(args_for(model_dir), 1, 8101, 6001)
    out = subprocess.run(
        [*argv[:2], "--print", *argv[2:]], capture_output=True, text=True, check=True
    ).stdout
    cmd = shlex.split(out.split(" -m ", 1)[1])  # the vLLM command after the env exports
    config = json.loads(cmd[cmd.index("--kv-events-config") + 1])
    # vLLM binds `tcp://*:PORT` itself; the topic is llm-d's, naming this server's port
    assert config["endpoint"] == "tcp://*:6001"
    assert config["topic"] == "kv@127.0.0.1:8101@tiny"
    assert "--enable-scale-out" in cmd  # vllm-router's /v1/*/render calls need it
    assert cmd[cmd.index("--num-gpu-blocks-override") + 1] == "64"
    assert cmd[cmd.index("--block-size") + 1] == "32"


@pytest.mark.parametrize(
    "setup", ["epp-approx", "epp-sticky", "epp-precise", "epp-precise-weighted", "epp-load"]
)
def test_epp_configs_load_and_tokenize_with_the_model(setup, model_dir, tmp_path) -> None:
    rr = load()
    path = rr.config_for(setup, tmp_path, args_for(model_dir))
    text = path.read_text()
    load_config_text(text, str(path))  # the EPP accepts it (raises ConfigError if not)
    plugins = {p["type"]: p.get("parameters", {}) for p in yaml.safe_load(text)["plugins"]}
    if setup in ("epp-approx", "epp-sticky"):
        assert plugins["approx-prefix-cache-producer"]["tokenizer"] == model_dir
    if setup in ("epp-sticky", "epp-precise"):  # the default's shape, not the weighted blend
        assert "prefix-cache-affinity-filter" in plugins
    if setup == "epp-precise-weighted":
        assert "prefix-cache-affinity-filter" not in plugins and "queue-scorer" in plugins
    if setup.startswith("epp-precise"):
        producer = plugins["precise-prefix-cache-producer"]
        assert producer["mode"] == "connect" and "endpoint" not in producer
        assert producer["tokenizer"] == model_dir
        assert producer["blockSizeTokens"] == 32


def test_config_helpers_name_a_config_that_changed_shape() -> None:
    rr = load()
    with pytest.raises(ValueError, match="approx-prefix-cache-producer"):
        rr.with_tokenizer("plugins: []\n", "/m")
    with pytest.raises(ValueError, match="changed shape"):
        rr.precise_connect("plugins: []\n", "/m")


def test_median_row_over_runs() -> None:
    rr = load()
    runs = [
        {"setup": "vr-kv", "hit_rate": 0.5, "ideal": 0.8, "of_ideal": 0.625, "p50": 1.0,
         "p90": 2.0, "req_s": 3.0, "errors": 1},
        {"setup": "vr-kv", "hit_rate": 0.7, "ideal": 0.8, "of_ideal": 0.875, "p50": None,
         "p90": None, "req_s": 1.0, "errors": 0},
        {"setup": "vr-kv", "hit_rate": 0.6, "ideal": 0.9, "of_ideal": 0.667, "p50": 3.0,
         "p90": 4.0, "req_s": 2.0, "errors": 2},
    ]  # fmt: skip
    row = rr.median_row(runs)
    assert row["hit_rate"] == 0.6 and row["ideal"] == 0.8 and row["of_ideal"] == 0.667
    assert row["p50"] == 2.0  # median of the two runs that have one: (1 + 3) / 2
    assert row["req_s"] == 2.0
    assert row["errors"] == 3 and row["runs"] == 3  # errors summed: 1 + 0 + 2
