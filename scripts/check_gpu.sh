#!/usr/bin/env bash
# One GPU check command for a machine with CUDA: bf16 training, liger's fused JSD against the GKD
# path, the hf: eval policy on CUDA, and vLLM colocate where vLLM is installed, each on the
# offline tiny model with no downloads, then the `scale:` line: the trainer's cost against plain
# TRL at the Qwen3-0.6B shape (benchmarks/trainer_overhead.py, about 5 minutes; --skip-scale
# leaves it out) (scripts/gpu_checks.py). One line per check; a check that
# cannot run here prints `unavailable: <why>` (without CUDA, all of them: exit 0); exit 1 when a
# check ran and failed. Uses .venv when it exists (scripts/setup_env.sh train[,liger,vllm]).
set -euo pipefail
cd "$(dirname "$0")/.."
python_bin="${PYTHON:-python3}"
[ -x .venv/bin/python ] && python_bin=.venv/bin/python
exec "$python_bin" scripts/gpu_checks.py "$@"
