#!/usr/bin/env bash
# The main job on the embedded default: start the env server, play scripted debates on the
# built-in problems over /ws/mux, print the report, stop the server. Installs what it needs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
. .venv/bin/activate
mathdebate demo "$@"
