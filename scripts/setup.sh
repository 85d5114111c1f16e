#!/usr/bin/env bash
# Create .venv with phalanx and its dependencies. `--test` adds what the test suite needs.
# Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-$(command -v python3.11 || command -v python3)}
[ -x .venv/bin/python ] || "$python" -m venv .venv
# The constraint file also reaches the isolated build of visdom's sdist (setuptools<81).
export PIP_CONSTRAINT="$PWD/constraints.txt"
pip_install() {
  # pip's notices about unused local index folders are noise; real errors still show.
  .venv/bin/python -m pip install --quiet "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}
if [ "${1:-}" = "--test" ]; then
  pip_install -e ".[test]"
  # The browser test drives Debian's Chromium (never a downloaded browser build).
  if ! command -v chromium >/dev/null; then
    if [ "$(id -u)" = 0 ]; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
      echo "setup.sh: chromium is missing: sudo apt-get install chromium (the browser test needs it)" >&2
    fi
  fi
else
  pip_install -e .
fi
# visdom downloads its page's JavaScript from CDNs at first start; fetch the same files from the
# npm registry instead, so `phalanx visualize` works with no internet.
.venv/bin/python -m phalanx.visdom_assets || echo "setup.sh: warning: visdom's page assets are missing;" \
  "phalanx visualize needs them (npm must reach the npm registry)" >&2
echo "setup.sh: ready: $(.venv/bin/phalanx --version)"
