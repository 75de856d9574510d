#!/usr/bin/env bash
# Install everything the test suite needs into .venv, then run it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh train,test
. .venv/bin/activate
python -m pytest -q "$@"
