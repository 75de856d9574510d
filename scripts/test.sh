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
python -m pytest -q "$@"
