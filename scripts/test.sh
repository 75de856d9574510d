#!/usr/bin/env bash
# The project's test command. Installs everything the checks need into .venv, then runs five
# parts and ends with one line per part, its status and its time:
#   static checks   ruff, mypy, the import contracts (configured in pyproject.toml)
#   docs            mkdocs build --strict (scripts/docs.sh build; broken links and anchors fail it)
#   vLLM            scripts/check_vllm_cpu.sh, in its own cached environment
#   compose         scripts/check_compose.sh (`docker compose up` for real, where the machine allows)
#   pytest          the test suite; arguments go to pytest (MATHDEBATE_PYTEST_WORKERS=N: N processes)
# The vLLM and compose parts run in the background, beside the static checks, the docs and pytest
# (they are mostly installs and image builds, waiting on the registries and the disk, which the
# suite's CPU-bound tests leave room for); their output is printed after pytest's, in the usual
# order of the summary. MATHDEBATE_SERIAL_PARTS=1 runs them one after another instead, before pytest.
# A failing part does not stop the others. Each prints what failed: the static checks and pytest
# their own reports, the docs build its warnings, the vLLM and compose checks each failing test's
# (or step's) name and the first lines of its failure. Exit status: 0 when every part passed or
# was skipped; else pytest's status if pytest failed, else 1.
# MATHDEBATE_SKIP_VLLM_CPU=1 and MATHDEBATE_SKIP_COMPOSE=1 skip those two parts on a developer's
# machine (never under CI=true).
set -uo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)
bash scripts/setup_env.sh train,test,docs || { echo "test.sh: installing .venv (scripts/setup_env.sh train,test,docs) failed"; exit 1; }
# The viewer's browser test (tests/env_server/viewer/test_routes.py) drives Debian's chromium through chromedriver:
# install both, quietly, when chromium is missing and apt-get can (as root); else that test skips.
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
    echo "installing chromium and chromium-driver (apt-get) for the viewer's browser test"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; } >/dev/null 2>&1 \
        || echo "could not install chromium: the viewer's browser test will be skipped"
fi
. .venv/bin/activate
logs=$(mktemp -d)
# One tiny-model build for the vLLM check and the suite (tests/conftest.py reuses MATHDEBATE_TEST_TINY_MODEL), fresh per run.
if [ -z "${MATHDEBATE_TEST_TINY_MODEL:-}" ]; then
    export MATHDEBATE_TEST_TINY_MODEL="$logs/tiny-model"
fi
trap 'kill ${background_pids[@]:-} 2>/dev/null; rm -rf "$logs"' EXIT

summary_lines=()
failed_parts=()
part() { PART=$1; PART_T=$(date +%s); echo; echo "=== $PART ==="; }
# done_part STATUS [DETAIL]: STATUS is passed, FAILED or skipped.
done_part() {
    local seconds=$(( $(date +%s) - PART_T ))
    summary_lines+=("$(printf '%-14s %-7s %4d s' "$PART" "$1" "$seconds")${2:+  $2}")
    [ "$1" = FAILED ] && failed_parts+=("$PART")
    return 0
}

# vLLM and compose: started now, in the background (or in turn with MATHDEBATE_SERIAL_PARTS=1);
# each writes its own logs and its status, printed after pytest by report_vllm / report_compose.
run_vllm() {
    local t0; t0=$(date +%s)
    bash scripts/check_vllm_cpu.sh > "$logs/vllm.out" 2> "$logs/vllm.err"; echo "$? $(( $(date +%s) - t0 ))" > "$logs/vllm.rc"
}
run_compose() {
    local t0; t0=$(date +%s)
    bash scripts/check_compose.sh > "$logs/compose.log" 2>&1; echo "$? $(( $(date +%s) - t0 ))" > "$logs/compose.rc"
}
want_vllm=false; want_compose=false
{ [ "${CI:-}" = "true" ] || [ "${MATHDEBATE_SKIP_VLLM_CPU:-}" != "1" ]; } && want_vllm=true
{ [ "${CI:-}" = "true" ] || [ "${MATHDEBATE_SKIP_COMPOSE:-}" != "1" ]; } && want_compose=true
background_pids=()
workers="${MATHDEBATE_PYTEST_WORKERS:-0}"
vllm_after_pytest=false
[ "$workers" != 0 ] && [ "${MATHDEBATE_SERIAL_PARTS:-}" != "1" ] && vllm_after_pytest=true
if [ "${MATHDEBATE_SERIAL_PARTS:-}" = "1" ]; then
    $want_vllm && run_vllm
    $want_compose && run_compose
else
    if $want_vllm && $vllm_after_pytest; then  # only its environment now: its tests after pytest's
        { t0=$(date +%s); bash scripts/setup_vllm_cpu.sh > "$logs/vllm-env.out" 2> "$logs/vllm-env.err"
          echo "$? $(( $(date +%s) - t0 ))" > "$logs/vllm-env.rc"; } & vllm_env_pid=$!
        background_pids+=("$vllm_env_pid")
    elif $want_vllm; then run_vllm & background_pids+=($!); fi
    if $want_compose; then run_compose & background_pids+=($!); fi
    [ ${#background_pids[@]} -gt 0 ] && echo "vLLM and compose checks started in the background (their output follows pytest's)"
fi

# verifiers' own environment (tests/helpers/vf_eval.py: verifiers pins an mcp the test extra's
# openenv-core cannot import with), built beside the static checks and the docs; the tests that
# run vf-eval wait for it (a file lock) and report a failed build themselves.
python tests/helpers/vf_eval.py > "$logs/verifiers-env.log" 2>&1 & background_pids+=($!)

part "static checks"
static_failed=()
echo "ruff check:"; ruff check . || static_failed+=(ruff)
echo "mypy (strict for env_server):"; mypy || static_failed+=(mypy)
echo "import contracts (import-linter, pyproject.toml [tool.importlinter]):"; lint-imports --no-cache || static_failed+=(lint-imports)
if [ ${#static_failed[@]} -eq 0 ]; then done_part passed "ruff, mypy, lint-imports"; else done_part FAILED "${static_failed[*]} failed (above)"; fi

part "docs"
if bash scripts/docs.sh build > "$logs/docs.log" 2>&1; then
    done_part passed "mkdocs build --strict: $(grep -oE 'built in [0-9.]+ seconds' "$logs/docs.log" | tail -1)"
else
    # the warnings and errors that failed the strict build (not its INFO lines)
    grep -vE '^INFO' "$logs/docs.log" | head -n 40
    done_part FAILED "mkdocs build --strict (warnings above)"
fi

part "pytest"
# MATHDEBATE_PYTEST_WORKERS=N (default 0: one process) runs the suite in N processes side by side
# (pytest-xdist, --dist loadfile: a module's fixtures are built once; the modules holding a test
# marked slow first, tests/conftest.py, with xdist's own reorder off), each worker's torch on one
# thread; the vLLM tests then wait for pytest (their environment is still built beside it).
# Measured (docs/testing.md): warm, with no other part beside it, 3 workers took pytest from
# 1,615 s to 884 s; cold on 2 cores, beside the installs and image builds, the run is CPU-bound,
# the slowest tests doubled past their timeouts and the whole took longer, so the default stays
# one process. --durations: the slowest tests, printed with the summary.
xdist=()
if [ "$workers" != 0 ]; then
    xdist=(-n "$workers" --dist loadfile --no-loadscope-reorder)
    export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
fi
python -m pytest -q "${xdist[@]}" --durations=25 "$@" 2>&1 | tee "$logs/pytest.log"; pytest_rc=${PIPESTATUS[0]}
counts=$(grep -E '^=*.* (passed|failed|error|errors|skipped|deselected|no tests ran)( |,|=|$)' "$logs/pytest.log" | tail -1 \
         | sed -E 's/^=+ //; s/ =+$//')
if [ "$pytest_rc" -eq 0 ]; then done_part passed "$counts"; else done_part FAILED "$counts"; fi

# with test workers, the vLLM tests now (their environment was built beside pytest)
if $want_vllm && $vllm_after_pytest; then
    wait "$vllm_env_pid" 2>/dev/null
    run_vllm
fi

# the background parts: wait for them, then print their sections
[ ${#background_pids[@]} -gt 0 ] && wait "${background_pids[@]}" 2>/dev/null  # (the vLLM environment may be waited for already)
# done_part of a part that ran elsewhere: its own wall time, from its .rc file
part_from() { PART=$1; PART_T=$(( $(date +%s) - $(cut -d' ' -f2 "$2") )); echo; echo "=== $PART ==="; }

if $want_vllm; then
    part_from "vLLM" "$logs/vllm.rc"; vllm_rc=$(cut -d' ' -f1 "$logs/vllm.rc")
    [ -f "$logs/vllm-env.rc" ] && echo "the vLLM environment: built beside pytest in $(cut -d' ' -f2 "$logs/vllm-env.rc") s (exit $(cut -d' ' -f1 "$logs/vllm-env.rc")); the tests after pytest:"
    grep -E '^(vLLM \(|vllm serve start|vllm teacher:|vllm harness:|vllm verifiers:)' "$logs/vllm.err" | awk '!seen[$0]++' || true  # the tests' measured figures, once
    cat "$logs/vllm.out"
    line=$(grep -E '^vllm-cpu:' "$logs/vllm.out" | tail -1)
    if [ "$vllm_rc" -eq 0 ]; then
        done_part passed "${line#vllm-cpu: }"
    else
        # a failure before any test ran (the environment or the tiny model): the end of its output
        grep -qE '^(FAILED|ERROR) ' "$logs/vllm.out" || tail -n 20 "$logs/vllm.err"
        done_part FAILED "${line#vllm-cpu: }"
    fi
else
    part "vLLM"; echo "skipped: MATHDEBATE_SKIP_VLLM_CPU=1"; done_part skipped "MATHDEBATE_SKIP_VLLM_CPU=1"
fi

if $want_compose; then
    part_from "compose" "$logs/compose.rc"; compose_rc=$(cut -d' ' -f1 "$logs/compose.rc")
    line=$(grep -E '^compose check: (passed|FAILED|skipped)' "$logs/compose.log" | tail -1)
    if [ "$compose_rc" -eq 0 ]; then
        echo "$line"
        case "$line" in "compose check: skipped"*) done_part skipped "${line#compose check: skipped }" ;;
                        *) done_part passed "${line#compose check: passed }" ;; esac
    else
        # the failing step, why, and the last lines of its logs (check_compose.sh prints them together)
        if grep -q '^compose check: FAILED in step' "$logs/compose.log"; then
            sed -n '/^compose check: FAILED in step/,$p' "$logs/compose.log"
        else
            tail -n 30 "$logs/compose.log"
        fi
        done_part FAILED "${line#compose check: }"
    fi
else
    part "compose"; echo "skipped: MATHDEBATE_SKIP_COMPOSE=1"; done_part skipped "MATHDEBATE_SKIP_COMPOSE=1"
fi

echo
echo "=== test.sh summary ($(( ($(date +%s) - T0) / 60 )) min $(( ($(date +%s) - T0) % 60 )) s in all, install included) ==="
printf '%s\n' "${summary_lines[@]}"
if [ ${#failed_parts[@]} -eq 0 ]; then
    echo "test.sh: passed"
    exit 0
fi
echo "test.sh: FAILED ($(printf '%s, ' "${failed_parts[@]}" | sed 's/, $//'))"
[ "$pytest_rc" -ne 0 ] && exit "$pytest_rc"
exit 1
