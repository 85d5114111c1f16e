"""Make visdom 0.2.4 serve its page with no internet.

At first start visdom downloads its JavaScript, CSS and fonts from CDNs and crashes when it cannot
(no internet here, nor on many clusters). The same files, at the exact versions visdom expects,
are in the npm registry: ``python -m phalanx.visualize.assets`` fetches them with ``npm pack`` into
visdom's static folder and marks it built, so visdom never reaches for a CDN.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

MATHJAX_FILES = [
    "config/Safe.js",
    "config/TeX-AMS-MML_HTMLorMML.js",
    "extensions/Safe.js",
    "jax/output/SVG/fonts/TeX/fontdata.js",
    "jax/output/SVG/jax.js",
    "jax/output/SVG/fonts/TeX/Size1/Regular/Main.js",
    "jax/output/SVG/config.js",
    "MathJax.js",
]
BOOTSTRAP_FONTS = [("eot", ""), ("woff2", ""), ("woff", ""), ("ttf", ""), ("svg", "#glyphicons_halflingsregular")]

# (npm package, version, file in the package, where visdom's download_scripts() puts it under static/)
ASSETS: list[tuple[str, str, str, str]] = [
    ("jquery", "3.1.1", "dist/jquery.min.js", "js/jquery.min.js"),
    ("bootstrap", "3.3.7", "dist/js/bootstrap.min.js", "js/bootstrap.min.js"),
    ("bootstrap", "3.3.7", "dist/css/bootstrap.min.css", "css/bootstrap.min.css"),
    ("react", "16.2.0", "umd/react.production.min.js", "js/react-react.min.js"),
    ("react-dom", "16.2.0", "umd/react-dom.production.min.js", "js/react-dom.min.js"),
    ("react-modal", "3.1.10", "dist/react-modal.min.js", "js/react-modal.min.js"),
    ("plotly.js-dist-min", "2.11.1", "plotly.min.js", "js/plotly-plotly.min.js"),
    ("sjcl", "1.0.7", "sjcl.js", "js/sjcl.js"),
    ("layout-bin-packer", "1.4.0", "dist/layout-bin-packer.js.map", "js/layout-bin-packer.js.map"),
    ("layout-bin-packer", "1.4.0", "dist/layout-bin-packer.js", "js/layout_bin_packer.js"),
    ("d3", "3.5.17", "d3.min.js", "js/d3.v3.min.js"),
    ("d3-selection-multi", "1.0.1", "build/d3-selection-multi.js", "js/d3-selection-multi.v1.js"),
    ("save-svg-as-png", "1.4.17", "lib/saveSvgAsPng.js", "js/saveSvgAsPng.js"),
    ("react-resizable", "1.4.6", "css/styles.css", "css/react-resizable-styles.css"),
    ("react-grid-layout", "0.16.3", "css/styles.css", "css/react-grid-layout-styles.css"),
    ("classnames", "2.2.5", "index.js", "fonts/classnames"),
    *[
        (
            "bootstrap",
            "3.3.7",
            f"dist/fonts/glyphicons-halflings-regular.{ext}",
            f"fonts/glyphicons-halflings-regular.{ext}{suffix}",
        )
        for ext, suffix in BOOTSTRAP_FONTS
    ],
    *[("mathjax", "2.7.5", path, f"js/mathjax/2.7.5/{path}") for path in MATHJAX_FILES],
]
NPM_TIMEOUT = 300  # seconds for all of npm pack; npm alone retried an unreachable registry for 20+ minutes


def fix_command() -> str:
    """The command that installs the assets, with the interpreter that has phalanx (a bare
    ``python3`` outside the virtual environment would not find it)."""
    return f"{sys.executable} -m phalanx.visualize.assets"


def visdom_dir() -> Path:
    spec = importlib.util.find_spec("visdom")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("visdom is not installed")
    return Path(list(spec.submodule_search_locations)[0])


def visdom_version(root: Path) -> str:
    return (root / "VERSION").read_text().strip()


def missing_assets(root: Path | None = None) -> list[str]:
    """What visdom would try to download at start; empty when it can start offline."""
    root = root or visdom_dir()
    static = root / "static"
    missing = [dest for *_, dest in ASSETS if not (static / dest).is_file()]
    built = static / "version.built"
    if not built.is_file() or built.read_text().strip() != visdom_version(root):
        missing.append("version.built")
    return missing


def install(root: Path | None = None, log=print) -> None:
    root = root or visdom_dir()
    static = root / "static"
    packages = sorted({(name, version) for name, version, *_ in ASSETS})
    with tempfile.TemporaryDirectory() as tmp:
        specs = [f"{name}@{version}" for name, version in packages]
        log(f"visdom assets: npm pack {len(specs)} packages")
        # Bounded: two retries of a request at most, and a deadline for the whole download (a
        # user's own npm settings in the environment come first).
        env = {
            "npm_config_fetch_retries": "2",
            "npm_config_fetch_retry_maxtimeout": "20000",
            "npm_config_fetch_timeout": "60000",
            **os.environ,
        }
        try:
            subprocess.run(
                ["npm", "pack", "--silent", "--pack-destination", tmp, *specs],
                check=True,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                timeout=NPM_TIMEOUT,
            )
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"npm did not finish in {NPM_TIMEOUT} s; is the npm registry reachable?") from None
        except subprocess.CalledProcessError as exc:
            why = (exc.stderr or "").strip().splitlines()
            raise RuntimeError(f"npm pack failed: {why[-1] if why else exc}") from None
        for name, version, member, dest in ASSETS:
            tarball = Path(tmp) / f"{name.replace('/', '-')}-{version}.tgz"
            with tarfile.open(tarball) as archive:
                data = archive.extractfile(f"package/{member}")
                if data is None:
                    raise RuntimeError(f"{name}@{version} has no {member}")
                target = static / dest
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data.read())
    (static / "version.built").write_text(visdom_version(root))
    log(f"visdom assets: {len(ASSETS)} files in {static}")


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m phalanx.visualize.assets",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.parse_args(argv)
    missing = missing_assets()
    if not missing:
        print(f"visdom assets: complete in {visdom_dir() / 'static'}")
        return 0
    try:
        install()
    except (OSError, subprocess.CalledProcessError, RuntimeError) as exc:
        print(f"phalanx: cannot install visdom's page assets: {exc}", file=sys.stderr)
        return 1
    return 0 if not missing_assets() else 1


if __name__ == "__main__":
    sys.exit(main())
