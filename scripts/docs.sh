#!/usr/bin/env bash
# The documentation site (mkdocs.yml; the tools are the `docs` extra, installed into .venv here
# when missing).
#   ./scripts/docs.sh build   mkdocs build --strict into site/: any warning fails the build
#                             (broken internal links and anchors, pages left out of the nav,
#                             docstrings griffe cannot read, an undocumented TrainConfig field)
#   ./scripts/docs.sh serve   a local preview on http://127.0.0.1:8000 that rebuilds on every
#                             change (extra arguments go to mkdocs serve, e.g. -a 127.0.0.1:8010)
set -euo pipefail
cd "$(dirname "$0")/.."
cmd="${1:-build}"
[ $# -gt 0 ] && shift
if ! [ -x .venv/bin/mkdocs ] || ! .venv/bin/python -c "import mkdocstrings_handlers.python, material" 2>/dev/null; then
    bash scripts/setup_env.sh docs
fi
# Material prints a notice about its successor on every run; the build's own output is what counts.
export NO_MKDOCS_2_WARNING=1
case "$cmd" in
    build) exec .venv/bin/mkdocs build --strict --clean "$@" ;;
    serve) exec .venv/bin/mkdocs serve "$@" ;;
    *) echo "usage: scripts/docs.sh build|serve [mkdocs options]" >&2; exit 2 ;;
esac
