#!/usr/bin/env bash
# Create .venv with phalanx and its dependencies. `--test` adds what the test suite needs.
# Safe to run again: it only installs what is missing. Needs: Python 3.11+ with venv, the PyPI
# registry; npm and the npm registry for visdom's page assets; with --test, root for apt-get.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "setup.sh: $*"; }
started=$SECONDS
python=${PYTHON:-$(command -v python3.11 || command -v python3)}
if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $("$python" --version)"
  "$python" -m venv .venv
fi
# The constraint file also reaches the isolated build of visdom's sdist (setuptools<81).
export PIP_CONSTRAINT="$PWD/constraints.txt"
pip_install() {
  # pip's notices about unused local index folders are noise; real errors still show.
  .venv/bin/python -m pip install --quiet "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}
if [ "${1:-}" = "--test" ]; then
  say "installing phalanx, torch, torchvision, visdom, boto3 and the test tools (pytest, moto, playwright," \
      "hypothesis) from PyPI (about 2 minutes the first time; torch is the largest download)"
  pip_install -e ".[test]"
  # DeepLIIF 1.2.7, the reference --task deepliif is compared with: its files only (its pins want
  # another torch), in a folder of their own that the tests load its network modules from.
  [ -f .venv/deepliif-1.2.7/deepliif/models/DeepLIIF_model.py ] || \
    pip_install --no-deps --target .venv/deepliif-1.2.7 deepliif==1.2.7
  # Real parts the tests drive: Debian's Chromium (the page test; never a downloaded browser
  # build), SLURM with munge and Open MPI (the scheduler tests).
  missing=()
  for tool in chromium:chromium slurmctld:slurm-wlm munged:munge mpirun:openmpi-bin; do
    command -v "${tool%%:*}" >/dev/null || missing+=("${tool#*:}")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
      say "installing Debian's ${missing[*]} for the browser and scheduler tests (about a minute)"
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        "${missing[@]}" >/dev/null
    else
      say "missing for some tests: sudo apt-get install ${missing[*]}" >&2
    fi
  fi
else
  say "installing phalanx, torch, torchvision, visdom and boto3 from PyPI (about 2 minutes the first time;" \
      "torch is the largest download)"
  pip_install -e .
fi
# pip compiles an installed wheel's modules to bytecode once; an editable install is compiled at
# every start where PYTHONDONTWRITEBYTECODE is set (this workplace, many Docker images): 157 ms of
# phalanx's imports before the first step, 55 ms from bytecode (benchmarks/first_step.py --profile).
# Python recompiles a module whose source is newer, so an edit is never run stale.
.venv/bin/python -m compileall -q phalanx
# visdom downloads its page's JavaScript from CDNs at first start; fetch the same files from the
# npm registry instead, so `phalanx visualize` works with no internet.
say "fetching visdom's page assets from the npm registry (about 20 seconds)"
.venv/bin/python -m phalanx.visualize.assets || say "warning: visdom's page assets are missing;" \
  "phalanx visualize needs them (npm must reach the npm registry)" >&2
say "ready in $((SECONDS - started)) s: $(.venv/bin/phalanx --version)"
