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
from typing import Any

import numpy as np
from scipy import ndimage

SEG_THRESH = 120  # DeepLIIF's DEFAULT_SEG_THRESH
NOISE_THRESH = 4  # DeepLIIF's DEFAULT_NOISE_THRESH
GREEN_MAX = 80
SIZE_RANGES = {"40x": (4, 7, 10), "20x": (3, 4, 6), "10x": (2, 2, 3)}  # sqrt size: min, default, max


def deepliif_pixels(output):
    """A generator's (C, H, W) output in [-1, 1] as DeepLIIF's ``tensor2im`` makes it an image:
    (x + 1) / 2 x 255 in float32, truncated to uint8 (not rounded), (H, W, 3)."""
    array = output.detach().cpu().float().numpy()
    if array.shape[0] == 1:
        array = np.tile(array, (3, 1, 1))
    return ((np.transpose(array, (1, 2, 0)) + 1) / 2.0 * 255.0).astype(np.uint8)


def resolution_of(tile_size: int) -> str:
    """The magnification DeepLIIF assumes for its tile size (512: 40x)."""
    return "40x" if tile_size > 384 else "20x" if tile_size > 192 else "10x"


def cells(
    seg: np.ndarray,
    marker: np.ndarray | None,
    seg_thresh: int = SEG_THRESH,
    noise_thresh: int = NOISE_THRESH,
    large_noise_thresh: int | None = None,
) -> dict[str, np.ndarray]:
    """Every cell of an (H, W, 3) uint8 segmentation image: its size, whether it holds at least as
    many positive as negative pixels, its brightest pixel of the marker image (the largest channel
    of each pixel), its label in ``labels`` (the image's regions, numbered in raster order of their
    first pixel, 0 the background) and that first pixel's flat index."""
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
    values, where = np.unique(flat, return_index=True)
    first = np.zeros(count + 1, dtype=np.int64)
    first[values] = where
    found = (sizes > noise_thresh) & ((sizes < large_noise_thresh) if large_noise_thresh is not None else True)
    return {
        "size": sizes[found],
        "positive": (positives >= negatives)[found],
        "marker": brightest[found],
        "label": np.arange(1, count + 1)[found],
        "first": first[1:][found],
        "labels": labels,
    }


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


def marker_histogram(marker: np.ndarray) -> np.ndarray:
    """How many pixels of the marker image (the largest channel of each) have each value 0 ... 255:
    all its thresholds need, and what the regions of a slide add up."""
    gray = marker.max(axis=-1) if marker.ndim == 3 else marker
    return np.bincount(gray.ravel(), minlength=256)


def percentile(histogram: np.ndarray, percent: float) -> float:
    """``np.percentile`` (its linear method, its arithmetic) of the values a histogram counts."""
    n = int(histogram.sum())
    virtual = (n - 1) * np.true_divide(percent, 100)
    ends = np.cumsum(histogram)  # the sorted values' index just past each value

    def value(index: int) -> np.uint8:
        return np.uint8(np.searchsorted(ends, min(index, n - 1), side="right"))

    if virtual >= n - 1:
        return float(value(n - 1))
    previous = int(np.floor(virtual))
    gamma = virtual - previous
    a, b = value(previous), value(previous + 1)
    return float(b - (b - a) * (1 - gamma) if gamma >= 0.5 else a + (b - a) * gamma)


def default_marker_thresh(histogram: np.ndarray) -> int:
    """DeepLIIF's: 90% of the way from the 0.1 to the 99.9 percentile of the marker's non-zero pixels."""
    nonzero = np.concatenate([[0], histogram[1:]])
    low, high = (round(percentile(nonzero, 0.1)), round(percentile(nonzero, 99.9))) if nonzero.sum() else (0, 0)
    return round((high - low) * 0.9) + low


def count(
    seg: np.ndarray,
    marker: np.ndarray | None,
    resolution: str = "40x",
    size_thresh: int | str | None = "default",
    marker_thresh: int | str | None = None,
    size_thresh_upper: int | None = None,
    seg_thresh: int = SEG_THRESH,
    noise_thresh: int = NOISE_THRESH,
    images_of: dict[str, np.ndarray] | None = None,
) -> dict[str, Any]:
    """DeepLIIF's scoring of one image: cells counted, positive, negative, percent positive, and the
    thresholds used (``compute_final_results``' ``scoring``). ``images_of={"input": ...}`` also gets
    its ``overlaid`` and ``refined`` images (``outlined``)."""
    found = cells(seg, marker, seg_thresh, noise_thresh)
    histogram = marker_histogram(marker) if marker is not None else None
    scoring, counted, positive = score(
        found, histogram, resolution, size_thresh, marker_thresh, size_thresh_upper, seg_thresh
    )
    if images_of is not None:
        images_of.update(
            zip(("overlaid", "refined"), outlined(images_of["input"], *outline_plan(found, counted, positive)))
        )
    return scoring


def score(
    found: dict[str, np.ndarray],
    histogram: np.ndarray | None,
    resolution: str,
    size_thresh: int | str | None,
    marker_thresh: int | str | None,
    size_thresh_upper: int | None,
    seg_thresh: int,
) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    """The scoring of the cells ``found`` (in raster order of their first pixels) and the marker's
    histogram (None without a marker), with which of them are counted and which are positive."""
    if size_thresh is None:
        size_thresh = 0
    elif size_thresh == "default":
        size_thresh = default_size_thresh(found["size"], resolution)
    if marker_thresh == "default" and histogram is not None:
        marker_thresh = default_marker_thresh(histogram)
    counted = (found["size"] > size_thresh) & (
        (found["size"] < size_thresh_upper) if size_thresh_upper is not None else True
    )
    positive = found["positive"] | (
        (found["marker"] > marker_thresh) if marker_thresh not in (None, "default") else False
    )
    num_pos, num_total = int((counted & positive).sum()), int(counted.sum())
    return (
        {
            "num_total": num_total,
            "num_pos": num_pos,
            "num_neg": num_total - num_pos,
            "percent_pos": round(num_pos / num_total * 100, 1) if num_pos > 0 else 0,
            "seg_thresh": seg_thresh,
            "size_thresh": size_thresh,
            "size_thresh_upper": size_thresh_upper,
            "marker_thresh": marker_thresh if histogram is not None else None,
        },
        counted,
        positive,
    )


# DeepLIIF's final images: each counted cell outlined (the background beside it, 4-connected, then
# grown twice by a pixel, 8-connected), red for positive, blue for negative.
POSITIVE, NEGATIVE, BORDER_POS, BORDER_NEG = 1, 2, 3, 4
_NEIGHBOURS = [(-1, -1), (-1, 0), (-1, 1), (0, -1), (0, 1), (1, -1), (1, 0), (1, 1)]  # in raster order


def _shifted(array: np.ndarray, dy: int, dx: int, fill: int = 0) -> np.ndarray:
    """``out[y, x] = array[y + dy, x + dx]`` (``fill`` outside)."""
    out = np.full_like(array, fill)
    height, width = array.shape
    out[max(0, -dy) : height - max(0, dy), max(0, -dx) : width - max(0, dx)] = array[
        max(0, dy) : height - max(0, -dy) or None, max(0, dx) : width - max(0, -dx) or None
    ]
    return out


def outline_plan(
    found: dict[str, np.ndarray], counted: np.ndarray, positive: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """What ``outlined`` needs of one image's cells: their labels, each label's class (0 where not
    counted) and rank among the counted cells (raster order of first pixels, from 1), and the
    counted cells' first pixels."""
    labels = found["labels"]
    classes = np.zeros(int(labels.max()) + 1 if labels.size else 1, dtype=np.uint8)
    classes[found["label"][counted]] = np.where(positive[counted], POSITIVE, NEGATIVE)
    order = np.zeros_like(classes, dtype=np.int64)
    order[found["label"][counted]] = np.arange(1, counted.sum() + 1)
    seeds = np.zeros(labels.size, dtype=bool)
    seeds[found["first"][counted]] = True
    return labels, classes, order, seeds.reshape(labels.shape)


def outlined(
    image: np.ndarray, labels: np.ndarray, classes: np.ndarray, order: np.ndarray, seeds: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """DeepLIIF's ``SegOverlaid`` (the input with each counted cell's outline) and ``SegRefined``
    (cells red or blue, outlines green), as ``compute_final_results`` draws them: a background pixel
    beside several cells takes the outline of the first in raster order of their first pixels, and
    one beside several outlines when they grow, the first of its neighbours in raster order. A
    cell's first pixel is drawn as outline too, and outlines only its other pixels' neighbours (DeepLIIF's).
    Each pixel depends on the labels within 3 pixels of it only (``outline_plan`` makes the rest)."""
    mask = classes[labels]
    # the outline: background pixels 4-beside a counted cell's pixel (not its first), the earliest cell's
    rank = np.where((mask > 0) & ~seeds, order[labels], 0)
    best = np.zeros(labels.shape, dtype=np.int64)
    for dy, dx in [(0, -1), (-1, 0), (1, 0), (0, 1)]:
        beside = _shifted(rank, dy, dx)
        best = np.where((beside > 0) & ((best == 0) | (beside < best)), beside, best)
    outline_class = np.zeros_like(order)
    outline_class[order[order > 0]] = classes[order > 0]
    border = (labels == 0) & (best > 0)
    mask = np.where(border, np.where(outline_class[best] == POSITIVE, BORDER_POS, BORDER_NEG), mask)
    mask = np.where(seeds & (mask > 0), np.where(mask == POSITIVE, BORDER_POS, BORDER_NEG), mask)
    for _ in range(2):  # enlarge_cell_boundaries, twice
        grown = np.zeros_like(mask)
        for dy, dx in reversed(_NEIGHBOURS):  # the first in raster order is written last, and wins
            beside = _shifted(mask, dy, dx)
            grown = np.where((beside == BORDER_POS) | (beside == BORDER_NEG), beside, grown)
        mask = np.where((mask == 0) & (labels == 0) & (grown > 0), grown, mask)
    overlaid, refined = image.copy(), np.zeros_like(image)
    overlaid[mask == BORDER_POS], overlaid[mask == BORDER_NEG] = (255, 0, 0), (0, 0, 255)
    refined[(mask == BORDER_POS) | (mask == BORDER_NEG), 1] = 255
    refined[mask == POSITIVE, 0], refined[mask == NEGATIVE, 2] = 255, 255
    return overlaid, refined


# --- each cell, as DeepLIIF's compute_cell_results (version 3) describes it ---------------------------
# The 8 neighbours clockwise from the top left, (dx, dy), twice: a walk round a pixel starts anywhere.
_CLOCKWISE = [(-1, -1), (0, -1), (1, -1), (1, 0), (1, 1), (0, 1), (-1, 1), (-1, 0)] * 2


def boundary(inside: np.ndarray, x: int, y: int) -> tuple[list[list[int]], list[list[int]]]:
    """The bounding box and the outline of the cell whose first pixel in raster order is (x, y):
    the pixels of its edge, clockwise from that one, as DeepLIIF's ``get_cell_boundary`` walks
    them (Moore neighbour tracing: from the pixel before, the next cell pixel clockwise)."""
    height, width = inside.shape

    def cell(px: int, py: int) -> bool:
        return 0 <= px < width and 0 <= py < height and bool(inside[py, px])

    at = 6  # anticlockwise from the left-below for the pixel the walk comes from
    while at >= 0 and not cell(x + _CLOCKWISE[at][0], y + _CLOCKWISE[at][1]):
        at -= 1
    if at < 0:  # a lone pixel
        return [[x, y], [x, y]], [[x, y]]
    px, py = x + _CLOCKWISE[at][0], y + _CLOCKWISE[at][1]
    points = [(px, py), (x, y)]
    low_x, low_y, high_x, high_y = x, y, x, y
    while True:
        at = _CLOCKWISE.index((px - x, py - y)) + 1
        while not cell(x + _CLOCKWISE[at][0], y + _CLOCKWISE[at][1]):
            at += 1
        px, py, x, y = x, y, x + _CLOCKWISE[at][0], y + _CLOCKWISE[at][1]
        points.append((x, y))
        low_x, high_x, low_y, high_y = min(low_x, x), max(high_x, x), min(low_y, y), max(high_y, y)
        if (px, py) == points[0] and (x, y) == points[1]:
            break
    return [[low_x, low_y], [high_x, high_y]], [list(p) for p in points[1:-1]]


def simple_contour(points: list[list[int]]) -> list[list[int]]:
    """An outline with each straight run kept as its first and last points (DeepLIIF's
    ``make_simple_contour``: a point stays where the direction turns, the last compared with the first)."""

    def same(a: int, b: int) -> bool:
        return a == b or (a > 0 and b > 0) or (a < 0 and b < 0)

    simple = [points[0]]
    if len(points) == 1:
        return simple
    ring = points + [points[0]]
    for i in range(1, len(points)):
        before, here, after = ring[i - 1], ring[i], ring[i + 1]
        if not (same(here[0] - before[0], after[0] - here[0]) and same(here[1] - before[1], after[1] - here[1])):
            simple.append(here)
    return simple


def cell_data(
    seg: np.ndarray,
    marker: np.ndarray | None,
    resolution: str,
    seg_thresh: int = SEG_THRESH,
    noise_thresh: int = NOISE_THRESH,
) -> dict[str, Any]:
    """Every cell of an image as DeepLIIF's ``compute_cell_results`` (version 3) gives it: its size,
    whether it is positive, its marker value, bounding box, centroid (the mean pixel, rounded
    half to even) and outline, in raster order of their first pixels; and the settings."""
    found = cells(seg, marker, seg_thresh, noise_thresh)
    labels = found["labels"]
    inside = labels > 0
    flat = labels.ravel()
    rows, cols = np.divmod(np.arange(flat.size), labels.shape[1])
    sum_y = np.bincount(flat, weights=rows, minlength=int(labels.max()) + 1)
    sum_x = np.bincount(flat, weights=cols, minlength=int(labels.max()) + 1)
    out = []
    for label, size, positive, brightest, first in zip(
        found["label"], found["size"], found["positive"], found["marker"], found["first"]
    ):
        y, x = divmod(int(first), labels.shape[1])
        box, outline = boundary(inside, x, y)
        out.append(
            {
                "size": int(size),
                "positive": bool(positive),
                "marker": int(brightest),
                "bbox": box,
                "centroid": [int(round(int(sum_x[label]) / int(size))), int(round(int(sum_y[label]) / int(size)))],
                "boundary": simple_contour(outline),
            }
        )
    settings: dict[str, Any] = {
        "default_size_thresh": default_size_thresh(found["size"], resolution),
        "noise_thresh": noise_thresh,
        "large_noise_thresh": None,
        "seg_thresh": seg_thresh,
        "default_marker_thresh": default_marker_thresh(marker_histogram(marker)) if marker is not None else None,
    }
    return {"cells": out, "settings": settings, "dataVersion": 3}
