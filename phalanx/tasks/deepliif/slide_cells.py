"""DeepLIIF's cell quantification of a whole slide, block by block, equal to ``cells`` on
the whole image: each block's connected components are labelled alone and the labels that touch
across a block border are joined (scipy's ``connected_components``), so a cell cut by a border is
one cell, counted once, and a background that reaches the slide's edge through other blocks is
background. Three passes, each a block at a time (``SlideCells``):

1. while the slide is predicted: the non-cell pixels' components (4-connected), which of them
   touch the slide's edge, and the marker's histogram;
2. the cells (8-connected, holes included) of the segmentation read back, with each cell's size,
   positive and negative pixels, brightest marker pixel and first pixel, and its labels kept;
3. once the thresholds are known (from every cell and the whole marker): the outlines
   (SegOverlaid, SegRefined), each block with the 3 pixels around it that an outline depends on.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy import ndimage
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from ...data.slides import SlideOutputs
from .cells import GREEN_MAX, NEGATIVE, POSITIVE, marker_histogram, outlined, score

OUTLINE_REACH = 3  # an outline pixel depends on the labels this close to it (``outlined``)


class BlockComponents:
    """Connected components of a (height, width) mask given block by block in raster order (each
    band of blocks left to right, the bands top to bottom): every block's labels are unique over
    the image, and ``components()`` joins those that touch across block borders."""

    def __init__(self, height: int, width: int, eight: bool):
        self.height, self.width = height, width
        self.structure = np.ones((3, 3), dtype=bool) if eight else None
        self.eight = eight
        self.count = 0
        self.pairs: list[np.ndarray] = []
        self.above = np.zeros(width, dtype=np.int64)  # the labels of the row above this band
        self.bottom = np.zeros(width, dtype=np.int64)  # this band's last row, as its blocks come
        self.band, self.left_column = -1, np.zeros(0, dtype=np.int64)

    def add(self, top: int, left: int, mask: np.ndarray) -> np.ndarray:
        local, found = ndimage.label(mask, self.structure)
        labels = np.where(local > 0, local.astype(np.int64) + self.count, 0)
        self.count += found
        if top != self.band:
            self.above, self.bottom, self.band = self.bottom, np.zeros(self.width, dtype=np.int64), top
        shifts = (-1, 0, 1) if self.eight else (0,)
        if left > 0:  # the block to the left: its last column beside this one's first
            for shift in shifts:
                self._join(np.roll(self.left_column, shift), labels[:, 0], _valid(len(labels), shift))
        if top > 0:  # the band above: its last row over this block's first, diagonals reaching next blocks
            for shift in shifts:
                row = np.zeros(labels.shape[1], dtype=np.int64)
                lo, hi = max(0, left + shift), min(self.width, left + labels.shape[1] + shift)
                row[lo - left - shift : hi - left - shift] = self.above[lo:hi]
                self._join(row, labels[0], np.ones(labels.shape[1], dtype=bool))
        self.left_column = labels[:, -1]
        self.bottom[left : left + labels.shape[1]] = labels[-1]
        return labels

    def _join(self, theirs: np.ndarray, ours: np.ndarray, valid: np.ndarray) -> None:
        both = valid & (theirs > 0) & (ours > 0)
        if both.any():
            self.pairs.append(np.stack([theirs[both], ours[both]], 1))

    def components(self) -> np.ndarray:
        """Each label's component (0 for 0; from 1, in no particular order)."""
        pairs = np.concatenate(self.pairs) if self.pairs else np.zeros((0, 2), dtype=np.int64)
        graph = coo_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(self.count + 1,) * 2)
        _, component = connected_components(graph, directed=False)
        component += 1  # label 0 touches nothing: alone in its component, which is renumbered 0
        component[0] = 0
        return component


def _valid(length: int, shift: int) -> np.ndarray:
    """Which entries of ``np.roll(x, shift)`` came from inside (not wrapped around)."""
    valid = np.ones(length, dtype=bool)
    if shift > 0:
        valid[:shift] = False
    elif shift < 0:
        valid[shift:] = False
    return valid


def cell_pixels(seg: np.ndarray, seg_thresh: int) -> tuple[np.ndarray, np.ndarray]:
    """(cell pixels, positive pixels) of a segmentation image, as ``cells.cells`` finds them."""
    seg = seg.astype(np.int32)
    cell = (seg[..., 0] + seg[..., 2] > seg_thresh) & (seg[..., 1] <= GREEN_MAX)
    return cell, cell & (seg[..., 0] >= seg[..., 2])


class SlideCells:
    """The passes above for one slide of (height, width) in blocks of ``block`` pixels, reading the
    Seg and Marker outputs back from ``outputs`` (names ``seg`` and ``marker``; no marker: None)."""

    def __init__(
        self, outputs: SlideOutputs, seg: str, marker: str | None, block: int, seg_thresh: int, noise_thresh: int
    ):
        self.outputs, self.seg, self.marker, self.block = outputs, seg, marker, block
        self.height, self.width = outputs.height, outputs.width
        self.seg_thresh, self.noise_thresh = seg_thresh, noise_thresh
        self.outside = BlockComponents(self.height, self.width, eight=False)
        self.edge_labels: list[np.ndarray] = []
        self.histogram = np.zeros(256, dtype=np.int64) if marker is not None else None

    def blocks(self):
        for top in range(0, self.height, self.block):
            for left in range(0, self.width, self.block):
                yield top, left, min(self.block, self.height - top), min(self.block, self.width - left)

    def add_block(self, top: int, left: int, seg: np.ndarray, marker: np.ndarray | None) -> None:
        """Pass 1, for the blocks in ``blocks()``' order, as they are predicted."""
        cell, _ = cell_pixels(seg, self.seg_thresh)
        labels = self.outside.add(top, left, ~cell)
        edges = [labels[0]] if top == 0 else []
        edges += [labels[-1]] if top + len(labels) == self.height else []
        edges += [labels[:, 0]] if left == 0 else []
        edges += [labels[:, -1]] if left + labels.shape[1] == self.width else []
        self.edge_labels.append(np.unique(np.concatenate(edges))) if edges else None
        if self.histogram is not None:
            assert marker is not None  # (a histogram: the slide's marker)
            self.histogram += marker_histogram(marker)

    def found(self) -> dict[str, np.ndarray]:
        """Pass 2: every cell of the slide, as ``cells.cells`` finds them in a whole image
        (with ``component``, each one's component number, for pass 3)."""
        component = self.outside.components()
        edges = np.concatenate(self.edge_labels) if self.edge_labels else np.zeros(0, dtype=np.int64)
        background = np.zeros(component.max() + 1, dtype=bool)
        background[component[edges[edges > 0]]] = True
        background[0] = False
        self.background = background[component]  # per non-cell label
        self.inside = BlockComponents(self.height, self.width, eight=True)
        stats = [self._cells_of_block(*block) for block in self.blocks()]
        ids, size, pos, neg, brightest, first = (np.concatenate(column) for column in zip(*stats))
        self.component = self.inside.components()
        owner = self.component[ids]
        total = self.component.max() + 1
        sizes = np.bincount(owner, weights=size, minlength=total)[1:].astype(np.int64)
        positives = np.bincount(owner, weights=pos, minlength=total)[1:]
        negatives = np.bincount(owner, weights=neg, minlength=total)[1:]
        marker = np.zeros(total, dtype=np.int64)
        np.maximum.at(marker, owner, brightest)
        firsts = np.full(total, np.iinfo(np.int64).max)
        np.minimum.at(firsts, owner, first)
        order = np.argsort(firsts[1:], kind="stable")  # raster order of first pixels, as a whole image numbers them
        keep = order[sizes[order] > self.noise_thresh]
        return {
            "size": sizes[keep],
            "positive": (positives >= negatives)[keep],
            "marker": marker[1:][keep],
            "first": firsts[1:][keep],
            "component": keep + 1,
        }

    def _cells_of_block(self, top: int, left: int, height: int, width: int) -> tuple[np.ndarray, ...]:
        seg = self.outputs.read(self.seg, top, left, height, width)
        cell, positive = cell_pixels(seg, self.seg_thresh)
        outside = self.outside_labels(top, left, ~cell)
        labels = self.inside.add(top, left, ~self.background[outside])
        self.outputs.write("cell labels", top, left, labels, output=False)
        present = np.unique(labels)
        present = present[present > 0]
        flat = labels.ravel()
        index = np.searchsorted(present, flat)  # per pixel, its cell's place in ``present``
        inside = flat > 0
        size = np.bincount(index[inside], minlength=len(present))
        pos = np.bincount(index[inside], weights=positive.ravel()[inside], minlength=len(present))
        neg = np.bincount(index[inside], weights=(cell & ~positive).ravel()[inside], minlength=len(present))
        if self.marker is not None:
            gray = self.outputs.read(self.marker, top, left, height, width).max(axis=-1)
            brightest = np.asarray(ndimage.maximum(gray, labels, present), dtype=np.int64).reshape(-1)
        else:
            brightest = np.zeros(len(present), dtype=np.int64)
        values, where = np.unique(flat, return_index=True)  # each label's first pixel in the block
        where = where[values > 0]
        first = (top + where // width) * self.width + left + where % width
        return present, size, pos, neg, brightest, first

    def outside_labels(self, top: int, left: int, mask: np.ndarray) -> np.ndarray:
        """Pass 1's labels of a block again (the same labelling, replayed in the same order)."""
        if top == 0 and left == 0:
            self.replayed = 0
        local, found = ndimage.label(mask)
        labels = np.where(local > 0, local.astype(np.int64) + self.replayed, 0)
        self.replayed += found
        return labels

    def score(self, found: dict[str, np.ndarray], resolution: str, size_thresh, marker_thresh, size_thresh_upper):
        return score(found, self.histogram, resolution, size_thresh, marker_thresh, size_thresh_upper, self.seg_thresh)

    def outline(
        self,
        found: dict[str, np.ndarray],
        counted: np.ndarray,
        positive: np.ndarray,
        input_region: Callable[[int, int, int, int], np.ndarray],
        overlaid: str,
        refined: str,
    ) -> None:
        """Pass 3: SegOverlaid and SegRefined, block by block (each with the pixels around it that
        its outlines depend on), into ``outputs``."""
        total = self.component.max() + 1
        classes = np.zeros(total, dtype=np.uint8)
        classes[found["component"][counted]] = np.where(positive[counted], POSITIVE, NEGATIVE)
        order = np.zeros(total, dtype=np.int64)
        order[found["component"][counted]] = np.arange(1, counted.sum() + 1)
        first = np.full(total, -1, dtype=np.int64)
        first[found["component"][counted]] = found["first"][counted]
        for top, left, height, width in self.blocks():
            t0, l0 = max(0, top - OUTLINE_REACH), max(0, left - OUTLINE_REACH)
            t1, l1 = min(self.height, top + height + OUTLINE_REACH), min(self.width, left + width + OUTLINE_REACH)
            labels = self.component[self.outputs.read("cell labels", t0, l0, t1 - t0, l1 - l0)]
            ys, xs = np.mgrid[t0:t1, l0:l1]
            seeds = (labels > 0) & (first[labels] == ys * self.width + xs)
            images = outlined(input_region(t0, l0, t1 - t0, l1 - l0), labels, classes, order, seeds)
            core = (slice(top - t0, top - t0 + height), slice(left - l0, left - l0 + width))
            for name, image in zip((overlaid, refined), images):
                self.outputs.write(name, top, left, image[core])
