"""The folder manifest's speed-ups at 100,000 files keep its verdicts: the listing as columns and
the whole-listing match of an unchanged folder, the JPEG header walk against PIL's open (12 encoders,
1,500 damaged headers), the scan by directory descriptor, and the grayscale look from the listing."""

from __future__ import annotations

import gc
import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
from phalanx_testdata import photo

from phalanx.config import RunConfig
from phalanx.data import build_datasets, manifest


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """A manifest cache of the test's own (tests/conftest.py gives the session one)."""
    monkeypatch.setenv("PHALANX_CACHE", str(tmp_path / "cache"))


def png_folder(root: Path, per_class: int, classes: int = 3, mode: str = "L") -> Path:
    from PIL import Image

    image = Image.new(mode, (6, 6), 128)
    for c in range(classes):
        folder = root / "train" / f"class{c}"
        folder.mkdir(parents=True)
        for i in range(per_class):
            image.save(folder / f"{i:05d}.png")
    return root


def pil_verdict(path: str) -> str | None:
    """What the manifest's check said before the header walk: PIL's open and verify alone."""
    from PIL import Image

    try:
        with Image.open(path) as img:
            img.verify()
        return None
    except Exception as exc:
        return type(exc).__name__


def jpegs_of_many_encoders() -> dict[str, bytes]:
    """JPEGs as cameras, PIL's options and torchvision's encoder write them."""
    import torch
    from PIL import Image
    from torchvision.io import encode_jpeg

    pixels = np.asarray(Image.open(io.BytesIO(photo(96, 64, 3))))
    out = {
        "photo": photo(96, 64, 0),
        "torchvision": encode_jpeg(torch.from_numpy(pixels).permute(2, 0, 1).contiguous(), quality=80)
        .numpy()
        .tobytes(),
    }
    options = {
        "q95 444": {"quality": 95, "subsampling": 0},
        "progressive": {"progressive": True},
        "optimised": {"optimize": True},
        "restart markers": {"restart_marker_blocks": 1},
        "comment": {"comment": b"a comment"},
        "dpi": {"dpi": (300, 300)},
        "icc": {"icc_profile": b"\0" * 3000},
        "exif": {"exif": Image.Exif().tobytes()},
    }
    for name, kwargs in options.items():
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, "JPEG", **kwargs)
        out[name] = buffer.getvalue()
    for mode in ("L", "CMYK"):
        buffer = io.BytesIO()
        Image.fromarray(pixels).convert(mode).save(buffer, "JPEG")
        out[mode] = buffer.getvalue()
    return out


def test_the_jpeg_header_walk_passes_what_pil_opens_and_leaves_the_rest_to_pil(tmp_path):
    encoded = jpegs_of_many_encoders()
    for name, data in encoded.items():
        path = tmp_path / f"{name}.jpg"
        path.write_bytes(data)
        assert pil_verdict(str(path)) is None and manifest.check_file(str(path)) is None, name
        # The walk itself takes the plain ones; EXIF goes to PIL (it reads the resolution from it).
        assert manifest.plain_jpeg(str(path)) is (name != "exif"), name
    # Damaged headers: whatever the walk passes, PIL opens; and the check's verdict is PIL's, reason too.
    rng = np.random.default_rng(0)
    path = tmp_path / "damaged.jpg"
    walked = 0
    for trial in range(1500):
        data = bytearray(list(encoded.values())[trial % len(encoded)])
        if trial % 3 == 0:  # cut short
            data = data[: int(rng.integers(2, min(len(data), 700)))]
        else:  # bytes of the header changed
            for _ in range(int(rng.integers(1, 4))):
                data[int(rng.integers(2, min(len(data), 400)))] = int(rng.integers(0, 256))
        path.write_bytes(bytes(data))
        plain = manifest.plain_jpeg(str(path))
        walked += plain
        if plain:
            assert pil_verdict(str(path)) is None, bytes(data[:64])
        assert manifest.check_file(str(path)) == pil_verdict(str(path))
    assert 100 < walked < 1500  # both ways were taken
    for junk in (b"", b"\xff\xd8", b"\xff\xd8\xff", b"GIF89a" + bytes(40), b"<html>not an image</html>"):
        path.write_bytes(junk)
        assert not manifest.plain_jpeg(str(path)) and manifest.check_file(str(path)) == pil_verdict(str(path))


def test_a_folder_unchanged_since_its_manifest_is_matched_whole_and_nothing_is_checked(tmp_path, monkeypatch):
    root = png_folder(tmp_path / "data", per_class=30)
    (root / "train/class1/00003.png").write_bytes(b"\x89PNG\r\n\x1a\n not an image any more")
    calls = []
    original = manifest.check_file
    monkeypatch.setattr(manifest, "check_file", lambda path: calls.append(path) or original(path))
    monkeypatch.setattr(manifest, "PARALLEL_FROM", 10**9)  # in this process, so the calls are counted
    first = manifest.checked(root / "train")
    assert len(calls) == 90 and first.broken == {"class1/00003.png": "UnidentifiedImageError"}
    record = json.loads(next((tmp_path / "cache").glob("manifest-*.json")).read_text())
    assert record["version"] == manifest.VERSION and len(record["paths"]) == len(record["sizes"]) == 90
    assert record["broken"] == first.broken
    calls.clear()
    written = next((tmp_path / "cache").glob("manifest-*.json")).stat().st_mtime_ns
    again = manifest.checked(root / "train")
    assert calls == [] and (again.paths, again.labels, again.broken) == (first.paths, first.labels, first.broken)
    assert next((tmp_path / "cache").glob("manifest-*.json")).stat().st_mtime_ns == written  # not rewritten
    assert len(again.paths) == 89 and again.labels == [0] * 30 + [1] * 29 + [2] * 30
    # A new file is checked alone; the broken one stays known without a second look.
    png_folder(tmp_path / "more", per_class=1, classes=1)
    os.replace(tmp_path / "more/train/class0/00000.png", root / "train/class2/99999.png")
    third = manifest.checked(root / "train")
    assert calls == [str((root / "train/class2/99999.png").resolve())]
    assert third.broken == first.broken and third.paths[-1] == "class2/99999.png" and len(third.paths) == 90


def test_a_manifest_of_the_older_format_is_not_trusted(tmp_path, monkeypatch):
    root = png_folder(tmp_path / "data", per_class=4)
    manifest.checked(root / "train")
    cache = next((tmp_path / "cache").glob("manifest-*.json"))
    old = {
        "version": 1,
        "root": str((root / "train").resolve()),
        "files": {f"class0/{i:05d}.png": [0, 0, "SyntaxError"] for i in range(4)},
    }
    cache.write_text(json.dumps(old))
    calls = []
    monkeypatch.setattr(manifest, "check_file", lambda path: calls.append(path))
    assert not manifest.checked(root / "train").broken and len(calls) == 12
    for broken_record in (
        '{"version": 2, "root": "%s", "paths": [1], "sizes": [], "mtimes": [], "broken": {}}',
        "not json",
    ):
        cache.write_text(broken_record % str((root / "train").resolve()) if "%" in broken_record else broken_record)
        calls.clear()
        assert len(manifest.checked(root / "train").paths) == 12 and len(calls) == 12


def test_the_manifest_leaves_the_garbage_collector_as_it_found_it(tmp_path):
    root = png_folder(tmp_path / "data", per_class=2)
    assert gc.isenabled()
    manifest.checked(root / "train")
    assert gc.isenabled()
    gc.disable()
    try:
        manifest.checked(root / "train")
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_scan_lists_nested_folders_and_linked_class_folders_in_path_order(tmp_path):
    root = png_folder(tmp_path / "data", per_class=2, classes=1)
    nested = root / "train/class0/b_sub"
    nested.mkdir()
    (root / "train/class0/00000.png").rename(nested / "x.png")
    (root / "train/class0/.hidden").mkdir()
    (root / "train/class0/notes.txt").write_text("not an image")
    png_folder(tmp_path / "elsewhere", per_class=1, classes=1)
    os.symlink(tmp_path / "elsewhere/train/class0", root / "train/class1")
    scanned = manifest.scan(root / "train", None)
    assert scanned.classes == ["class0", "class1"]
    assert scanned.paths == ["class0/00001.png", "class0/b_sub/x.png", "class1/00000.png"]
    assert scanned.labels == [0, 0, 1] and len(scanned.sizes) == len(scanned.mtimes) == 3
    assert scanned.sizes[1] == (nested / "x.png").stat().st_size


def test_a_folders_colour_is_judged_from_its_readable_images(tmp_path):
    gray = png_folder(tmp_path / "gray", per_class=5, mode="L")
    (gray / "train/class0/00000.png").write_bytes(b"\x89PNG broken")  # first in its class: skipped
    data = build_datasets(RunConfig.flat(dataroot=str(gray), skip_broken=True, image_size=6), None)
    assert data.in_channels == 1 and len(data.train) + len(data.val) == 14
    colour = png_folder(tmp_path / "colour", per_class=5, mode="RGB")
    assert build_datasets(RunConfig.flat(dataroot=str(colour), image_size=6), None).in_channels == 3


def test_an_image_is_read_by_its_path_as_one_string(tmp_path):
    root = png_folder(tmp_path / "data", per_class=3, mode="RGB")
    data = build_datasets(RunConfig.flat(dataroot=str(root), image_size=6, augment="none"), None)
    files = data.train.plain.base.dataset if hasattr(data.train.plain.base, "dataset") else data.train.plain.base
    assert files.prefix == str(root / "train") + os.sep
    image, label = data.train[0]
    assert image.shape == (3, 6, 6) and label in (0, 1, 2)
    (root / "train" / files.paths[0]).write_bytes(b"gone")
    from phalanx.data.images import UnreadableImage

    with pytest.raises(UnreadableImage, match=f"cannot read image {root / 'train' / files.paths[0]} "):
        files[0]
