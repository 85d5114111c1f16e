#!/usr/bin/env bash
# The checks that keep the code as the docs say it is (CI runs them after the tests; run them before
# you push): ruff's lint and format, the import contracts of setup.cfg, and mypy over the package.
# Needs `bash scripts/setup.sh --test` (it installs ruff, import-linter and mypy).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
"$bin/ruff" check phalanx tests benchmarks scripts examples setup.py
"$bin/ruff" format --check phalanx tests benchmarks scripts examples setup.py
PYTHONPATH="$PWD" "$bin/lint-imports" --no-logo setup.cfg
"$bin/mypy"
echo "lint.sh: ruff, import contracts and mypy pass"
