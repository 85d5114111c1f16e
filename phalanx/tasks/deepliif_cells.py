"""DeepLIIF's cell quantification: positive and negative cells in a segmentation image, counted as
DeepLIIF 1.2.7's ``postprocessing.compute_final_results`` counts them, with ``scipy.ndimage``'s
connected components instead of its hand-written flood fills.

A pixel is a cell pixel where red + blue > ``seg_thresh`` and green <= 80 (positive where red >=
blue, else negative). The background is every other pixel connected to the image's border through
such pixels (4-connectivity); everything else, holes in a cell included, forms the cells
(8-connectivity). A cell larger than ``noise_thresh`` pixels (and smaller than
``large_noise_thresh``, if given) is found; one larger than ``size_thresh`` (default: from the
found cells' sizes, DeepLIIF's kernel-density rule for the resolution) is counted, positive if it
holds at least as many positive as negative pixels, or if its brightest marker pixel exceeds
``marker_thresh``.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import ndimage

SEG_THRESH = 120  # DeepLIIF's DEFAULT_SEG_THRESH
NOISE_THRESH = 4  # DeepLIIF's DEFAULT_NOISE_THRESH
GREEN_MAX = 80
SIZE_RANGES = {"40x": (4, 7, 10), "20x": (3, 4, 6), "10x": (2, 2, 3)}  # sqrt size: min, default, max


def resolution_of(tile_size: int) -> str:
    """The magnification DeepLIIF assumes for its tile size (512: 40x)."""
    return "40x" if tile_size > 384 else "20x" if tile_size > 192 else "10x"


def cells(seg: np.ndarray, marker: np.ndarray | None, seg_thresh: int = SEG_THRESH,
          noise_thresh: int = NOISE_THRESH, large_noise_thresh: int | None = None) -> dict[str, np.ndarray]:
    """Every cell of an (H, W, 3) uint8 segmentation image: its size, its positive and negative
    pixel counts, and its brightest pixel of the marker image (the largest channel of each pixel)."""
    seg = seg.astype(np.int32)
    cell_pixel = (seg[..., 0] + seg[..., 2] > seg_thresh) & (seg[..., 1] <= GREEN_MAX)
    positive = cell_pixel & (seg[..., 0] >= seg[..., 2])
    outside, _ = ndimage.label(~cell_pixel)  # 4-connected
    border = np.unique(np.concatenate([outside[0], outside[-1], outside[:, 0], outside[:, -1]]))
    background = np.isin(outside, border[border > 0])
    labels, count = ndimage.label(~background, structure=np.ones((3, 3), dtype=bool))
    flat = labels.ravel()
    sizes = np.bincount(flat, minlength=count + 1)[1:]
    positives = np.bincount(flat, weights=positive.ravel(), minlength=count + 1)[1:]
    negatives = np.bincount(flat, weights=(cell_pixel & ~positive).ravel(), minlength=count + 1)[1:]
    if marker is not None:
        gray = marker.max(axis=-1) if marker.ndim == 3 else marker
        brightest = np.asarray(ndimage.maximum(gray, labels, np.arange(1, count + 1)), dtype=np.int64).reshape(-1)
    else:
        brightest = np.zeros(count, dtype=np.int64)
    found = (sizes > noise_thresh) & ((sizes < large_noise_thresh) if large_noise_thresh is not None else True)
    return {"size": sizes[found], "positive": (positives >= negatives)[found], "marker": brightest[found]}


def default_size_thresh(sizes: np.ndarray, resolution: str) -> int:
    """DeepLIIF's default: the first local minimum of a kernel density estimate (500 bins,
    bandwidth 1) of the cells' sqrt sizes, kept within the resolution's range."""
    if len(sizes) <= 1:
        return 0
    values = np.sqrt(sizes.astype(np.int64))
    step = (values.max() + 1) / 500
    x = np.arange(500) * step
    total = np.zeros(500)
    for value in values:  # summed in DeepLIIF's order
        scaled = (x - value) * 1.0
        total += np.exp(-(scaled * scaled / 2)) * (1 / math.sqrt(2 * math.pi))
    kde = (total / (len(values) * 1.0)).astype(np.float32)
    minima = np.flatnonzero((kde[1:-1] < kde[:-2]) & (kde[1:-1] < kde[2:])) + 1
    index = int(minima[0]) if len(minima) else 1
    low, default, high = SIZE_RANGES.get(resolution, SIZE_RANGES["40x"])
    root = (index - 1) * step
    root = low if root < low else default if root > high else root
    return round(root * root)


def default_marker_thresh(marker: np.ndarray) -> int:
    """DeepLIIF's: 90% of the way from the 0.1 to the 99.9 percentile of the marker's non-zero pixels."""
    gray = marker.max(axis=-1) if marker.ndim == 3 else marker
    nonzero = gray[gray != 0]
    low, high = (round(np.percentile(nonzero, 0.1)), round(np.percentile(nonzero, 99.9))) if len(nonzero) else (0, 0)
    return round((high - low) * 0.9) + low


def count(seg: np.ndarray, marker: np.ndarray | None, resolution: str = "40x", size_thresh: int | str | None = "default",
          marker_thresh: int | str | None = None, size_thresh_upper: int | None = None, seg_thresh: int = SEG_THRESH,
          noise_thresh: int = NOISE_THRESH) -> dict[str, object]:
    """DeepLIIF's scoring of one image: cells counted, positive, negative, percent positive, and the
    thresholds used (``compute_final_results``' ``scoring``)."""
    found = cells(seg, marker, seg_thresh, noise_thresh)
    if size_thresh is None:
        size_thresh = 0
    elif size_thresh == "default":
        size_thresh = default_size_thresh(found["size"], resolution)
    if marker_thresh == "default" and marker is not None:
        marker_thresh = default_marker_thresh(marker)
    counted = (found["size"] > size_thresh) & ((found["size"] < size_thresh_upper) if size_thresh_upper is not None else True)
    positive = found["positive"] | ((found["marker"] > marker_thresh) if marker_thresh not in (None, "default") else False)
    num_pos, num_total = int((counted & positive).sum()), int(counted.sum())
    return {"num_total": num_total, "num_pos": num_pos, "num_neg": num_total - num_pos,
            "percent_pos": round(num_pos / num_total * 100, 1) if num_pos > 0 else 0,
            "seg_thresh": seg_thresh, "size_thresh": size_thresh, "size_thresh_upper": size_thresh_upper,
            "marker_thresh": marker_thresh if marker is not None else None}
