"""Run DeepLIIF 1.2.7's own command line (its ``cli.py``, unchanged) as ``deepliif`` would:
``python tests/deepliif_cli.py test --input-dir I --output-dir O --tile-size 512 --model-dir D``.

Its dependencies are installed by ``scripts/setup.sh --test`` (numba, scikit-image, OpenCV, dask,
dominate), except the Java bridges to Bio-Formats (``python-bioformats``, ``javabridge``), which
only its whole-slide readers use: they are empty modules here, so ``test_wsi`` and ``.svs``/``.qptiff``
slides do not run."""

import sys
import types
from pathlib import Path

ROOT = Path(sys.prefix) / "deepliif-1.2.7"

for name in ("bioformats", "javabridge", "bioformats.omexml"):
    sys.modules[name] = types.ModuleType(name)
sys.modules["bioformats"].omexml = sys.modules["bioformats.omexml"]
sys.path.insert(0, str(ROOT))

import cli  # noqa: E402  (DeepLIIF's cli.py, found in ROOT)

if __name__ == "__main__":
    cli.cli()
