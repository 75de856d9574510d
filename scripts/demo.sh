#!/usr/bin/env bash
# The main job, on the embedded default (no model or data downloads): start the env server,
# play scripted debates over /ws/mux on the built-in problems, then train a few GRPO steps on CPU
# with the offline tiny model (all three loss channels), write metrics and a plot under
# outputs/demo, and stop the server. Installs what it needs into .venv first.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh train
. .venv/bin/activate
mathdebate demo "$@"
