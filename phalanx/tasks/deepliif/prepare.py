"""``phalanx prepare-training-data``: DeepLIIF's raw layout joined into its training images, as
``deepliif prepare-training-data`` joins them.

Every file whose name holds ``IHC`` is an input; its partners are the same name with ``IHC``
replaced by ``Hematoxylin``, ``DAPI``, ``Lap2``, ``Marker`` and ``Seg``. Each of the six is resized
to ``size`` x ``size`` as DeepLIIF's ``cv2.resize`` resizes it (``resized``, without OpenCV) and
the six are written side by side under the IHC file's name, in ``OUTPUT/train/`` or ``OUTPUT/val/``.

Where DeepLIIF draws each image's split at random (unseeded), phalanx holds out
``round(ratio x n)`` images chosen by ``seed``: the same split on every run. Every partner is
checked before anything is written, an existing file is never replaced, and each image is written
whole (atomically): a mistake leaves nothing half-written and nothing lost."""

from __future__ import annotations

import io
import random
from pathlib import Path

import numpy as np

from ...errors import PhalanxError
from ...system.atomic import atomic_write_bytes

PARTNERS = ("Hematoxylin", "DAPI", "Lap2", "Marker", "Seg")  # deepliif prepare-training-data's order
MAX_FILE_BYTES = 256 << 20  # a 512 px PNG is under 1 MiB; this refuses what is not a tile


def partners_of(ihc: Path) -> list[Path]:
    """The IHC file and its five partners, in the order they are joined."""
    return [ihc] + [ihc.with_name(ihc.name.replace("IHC", name)) for name in PARTNERS]


def read_pixels(path: Path) -> np.ndarray:
    """(H, W, 3) uint8 RGB of an image file (grayscale repeated, as OpenCV's imread gives colour)."""
    from PIL import Image, UnidentifiedImageError

    if path.stat().st_size > MAX_FILE_BYTES:
        raise PhalanxError(f"{path} is larger than {MAX_FILE_BYTES >> 20} MiB: not a training tile", "--input-dir")
    try:
        with Image.open(path) as image:
            return np.asarray(image.convert("RGB"))
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as exc:
        raise PhalanxError(f"cannot read {path} as an image ({exc})", "--input-dir") from None


COEF_BITS = 11  # OpenCV's INTER_RESIZE_COEF_BITS: interpolation weights in 11-bit fixed point


def _weights(source: int, size: int, clamp_weight: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """OpenCV's linear weights along one side: source positions (first, second) and their 11-bit
    weights, computed in float32 and rounded each on its own as ``cv::resize`` does. Along the
    width a position before the first pixel or past the last takes it whole (``clamp_weight``);
    along the height only the rows are clamped, the weights kept."""
    at = ((np.arange(size) + 0.5) * (source / size) - 0.5).astype(np.float32)
    first = np.floor(at).astype(np.int64)
    fraction = (at - first).astype(np.float32)
    if clamp_weight:
        before, past = first < 0, first >= source - 1
        fraction[before | past] = 0
        first = np.clip(first, 0, source - 1)
    scale = np.float32(1 << COEF_BITS)
    w0 = np.rint((np.float32(1) - fraction) * scale).astype(np.int64)
    w1 = np.rint(fraction * scale).astype(np.int64)
    return np.clip(first, 0, source - 1), np.clip(first + 1, 0, source - 1), w0, w1


def resized(pixels: np.ndarray, size: int) -> np.ndarray:
    """``size`` x ``size`` as OpenCV's ``cv2.resize(pixels, (size, size))`` makes it of 8-bit
    pixels, integer for integer: linear interpolation in its fixed point (each row's 11-bit weighted
    sum, shifted right by 4, multiplied by the 11-bit row weights keeping the high 16 bits, then
    rounded off the last 2 bits: its vectorised path, which every output row of a multiple of its
    vector width takes, 512 x 3 channels among them). A halving of both sides, where OpenCV takes
    its 2 x 2 mean (INTER_AREA) instead, comes out the same: the weights are then exact halves."""
    height, width = pixels.shape[:2]
    if (height, width) == (size, size):
        return pixels
    values = pixels.astype(np.int64)
    left, right, a0, a1 = _weights(width, size, clamp_weight=True)
    top, bottom, b0, b1 = _weights(height, size, clamp_weight=False)
    rows = (values[:, left] * a0[None, :, None] + values[:, right] * a1[None, :, None]) >> 4
    summed = ((rows[top] * b0[:, None, None]) >> 16) + ((rows[bottom] * b1[:, None, None]) >> 16)
    return np.clip((summed + 2) >> 2, 0, 255).astype(np.uint8)


def encoded(pixels: np.ndarray, name: str) -> bytes:
    """The joined image in the format its name's extension says (PNG where PIL knows none)."""
    from PIL import Image

    kind = Image.registered_extensions().get(Path(name).suffix.lower(), "PNG")
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=kind)
    return buffer.getvalue()


def prepare_training_data(input_dir: str, output_dir: str, validation_ratio: float, seed: int, size: int) -> str:
    """Write the joined images; returns what was written, in words."""
    source, target = Path(input_dir), Path(output_dir)
    if not source.is_dir():
        raise PhalanxError(f"{source} is not a folder", "--input-dir")
    if not 0 <= validation_ratio <= 1:
        raise PhalanxError(f"expected a fraction from 0 to 1, got {validation_ratio}", "--validation-ratio")
    if size < 1:
        raise PhalanxError(f"expected a positive number of pixels, got {size}", "--size")
    inputs = sorted(p for p in source.iterdir() if "IHC" in p.name and p.is_file())
    if not inputs:
        raise PhalanxError(f"{source} has no file whose name holds IHC (NAME_IHC.png and its partners)", "--input-dir")
    missing = [p for ihc in inputs for p in partners_of(ihc)[1:] if not p.is_file()]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise PhalanxError(
            f"{missing[0]} is missing{more}: each IHC image needs its {', '.join(PARTNERS)}", "--input-dir"
        )
    held_out = set(random.Random(seed).sample(range(len(inputs)), round(validation_ratio * len(inputs))))
    places = [target / ("val" if i in held_out else "train") / ihc.name for i, ihc in enumerate(inputs)]
    existing = [p for p in places if p.exists()]
    if existing:
        raise PhalanxError(
            f"{existing[0]} exists: nothing written (another --output-dir, or remove it)", "--output-dir"
        )
    for split in ("train", "val"):
        (target / split).mkdir(parents=True, exist_ok=True)
    for done, (ihc, place) in enumerate(zip(inputs, places)):
        try:
            pixels = np.concatenate([resized(read_pixels(p), size) for p in partners_of(ihc)], 1)
        except PhalanxError as exc:
            raise PhalanxError(f"{exc.message}; {done} of {len(inputs)} images written before it", exc.option) from None
        atomic_write_bytes(place, encoded(pixels, place.name))
    return f"wrote {len(inputs) - len(held_out)} images to {target / 'train'} and {len(held_out)} to {target / 'val'}"
