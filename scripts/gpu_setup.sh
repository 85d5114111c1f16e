#!/usr/bin/env bash
# On a GPU machine with no package registry whose Python already has PyTorch, torchvision, Lightning,
# timm, click, PyYAML, pytest and hypothesis: install the wheels that scripts/gpu_wheels.sh put into
# .whl/, visdom's page assets, and phalanx itself (no dependencies fetched). Then:
#     python3 -m pytest                 # the suite, the CUDA tests included
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
# What the image must already hold: the wheels in .whl/ are installed without their dependencies.
# Lightning and timm serve the benchmark and a few tests, pytest-timeout the suite's time limits.
"$python" - <<'PY'
import importlib.util, sys
def lacking(names): return ", ".join(n for n in names if importlib.util.find_spec(n) is None)
if needed := lacking(["torch", "torchvision", "click", "yaml", "pytest", "hypothesis"]):
    sys.exit(f"gpu_setup.sh: this Python lacks {needed}: bring them as wheels into .whl/")
if wanted := lacking(["lightning", "timm", "pytest_timeout"]):
    print(f"gpu_setup.sh: warning: this Python lacks {wanted}", file=sys.stderr)
PY
"$python" -m pip install --quiet --no-index --no-deps --no-compile .whl/*.whl
# DeepLIIF 1.2.7's files where tests/deepliif_reference.py loads them (as scripts/setup.sh --test does)
prefix=$("$python" -c "import sys; print(sys.prefix)")
"$python" -m pip install --quiet --no-index --no-deps --no-compile --target "$prefix/deepliif-1.2.7" .whl/deepliif/*
# phalanx itself, editable; where the image's build tools cannot do that offline, a .pth file
# puts this checkout on the path (the same effect) and a small launcher gives the command.
if ! "$python" -m pip install --quiet --no-index --no-deps --no-build-isolation -e . >/tmp/phalanx-pip.log 2>&1; then
  echo "gpu_setup.sh: pip could not install phalanx editable offline ($(grep -m1 -i 'error' /tmp/phalanx-pip.log));" \
       "using a .pth file instead"
  purelib=$("$python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  echo "$PWD" > "$purelib/phalanx-checkout.pth"
  bindir=$("$python" -c "import sysconfig; print(sysconfig.get_paths()['scripts'])")
  printf '#!/bin/sh\nexec "%s" -m phalanx.cli "$@"\n' "$(command -v "$python")" > "$bindir/phalanx"
  chmod +x "$bindir/phalanx"
fi
"$python" -m compileall -q phalanx  # bytecode once, as pip does for a wheel (scripts/setup.sh)
static=$("$python" -c "import visdom, os; print(os.path.join(os.path.dirname(visdom.__file__), 'static'))")
tar -xzf .whl/visdom-static.tar.gz -C "$static"
"$python" - <<'PY'
import importlib.metadata, torch, torchvision
from phalanx.visualize.assets import missing_assets
def version(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "missing"
gpus = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())) or "no GPU"
nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "none"
print(f"gpu_setup.sh: torch {torch.__version__}, torchvision {torchvision.__version__}, CUDA {torch.version.cuda}, "
      f"NCCL {nccl}, Lightning {version('lightning')}, timm {version('timm')}, {gpus}; "
      f"visdom assets {'missing' if missing_assets() else 'ready'}")
PY
