"""Object detection data in COCO format, the format users already have: ``SPLIT/images/*`` and
``SPLIT/annotations.json`` (COCO instances; ``file_name`` relative to ``images/``), or a JSON kept
elsewhere (``--annotations``).

The JSON is read bounded in size, and every image and box is checked before training starts: a
box outside its image, an unknown category, a missing image file is one line naming the file and
the annotation (or the image is left out and counted with ``--skip-broken``). Images without boxes
are kept: they teach a detector what is background.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from ..errors import PhalanxError
from .images import decode, read_bounded

MAX_ANNOTATION_BYTES = 1024 * 1024 * 1024  # a COCO train2017 instances file is 450 MB
OPTION = "--dataroot"


@dataclass
class CocoSplit:
    """One split: its images, their boxes (x, y, w, h as COCO has them) and the categories."""

    images_dir: Path
    annotations: Path
    categories: list[dict[str, Any]]  # [{"id": 3, "name": "three"}, ...], sorted by id
    images: list[dict[str, Any]]  # [{"id", "file_name", "width", "height"}, ...]
    boxes: dict[int, list[tuple[list[float], int]]]  # image id -> [(bbox xywh, category id), ...]
    raw: dict[str, Any]  # the JSON as read (pycocotools scores against it)
    skipped: dict[str, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.images)


def read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        if path.stat().st_size > MAX_ANNOTATION_BYTES:
            raise PhalanxError(f"{path} is larger than {MAX_ANNOTATION_BYTES // 2**20} MiB", what)
        with open(path, "rb") as fh:
            data = json.loads(fh.read(MAX_ANNOTATION_BYTES + 1))
    except FileNotFoundError:
        raise PhalanxError(f"{path} does not exist", what) from None
    except (OSError, ValueError) as exc:
        raise PhalanxError(f"{path} does not parse as JSON ({str(exc).splitlines()[0][:120]})", what) from None
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("images"), list)
        or not isinstance(data.get("annotations"), list)
        or not isinstance(data.get("categories"), list)
    ):
        raise PhalanxError(
            f"{path} is not COCO instances JSON (it needs images, annotations and categories lists)", what
        )
    return data


def load_split(
    split: Path, annotations: Path | None, skip_broken: bool, categories: list[dict[str, Any]] | None = None
) -> CocoSplit:
    """Read and check one split; ``categories``: the training split's (validation must use the same)."""
    images_dir = split / "images"
    json_path = annotations or split / "annotations.json"
    where = "--annotations" if annotations else OPTION
    if not images_dir.is_dir():
        raise PhalanxError(
            f"{split} has no images/ folder; expected {split}/images/ and {split}/annotations.json", OPTION
        )
    data = read_json(json_path, where)
    cats = _categories(data, json_path, where, categories)
    bad: dict[str, str] = {}
    images, sizes = _images(data, images_dir, json_path, where, bad)
    boxes = _boxes(data, {c["id"] for c in cats}, sizes, json_path, where, bad)
    if bad and not skip_broken:
        name, why = next(iter(bad.items()))
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise PhalanxError(f"{images_dir / name}: {why}{more}; --skip-broken leaves such images out", where)
    images = [image for image in images if image["file_name"] not in bad]
    if not images:
        raise PhalanxError(f"no usable image in {json_path}", where)
    kept = {image["id"] for image in images}
    return CocoSplit(
        images_dir,
        json_path,
        cats,
        images,
        {k: v for k, v in boxes.items() if k in kept},
        data,
        {str(images_dir / k): v for k, v in bad.items()},
    )


def _categories(
    data: dict[str, Any], json_path: Path, where: str, training: list[dict[str, Any]] | None
) -> list[dict[str, Any]]:
    try:
        cats: list[dict[str, Any]] = sorted(
            ({"id": int(c["id"]), "name": str(c.get("name", c["id"]))} for c in data["categories"]),
            key=lambda c: c["id"],
        )
    except (KeyError, TypeError, ValueError):
        raise PhalanxError(f"{json_path}: a category without an id", where) from None
    if not cats:
        raise PhalanxError(f"{json_path} declares no category", where)
    if training is not None and [c["id"] for c in cats] != [c["id"] for c in training]:
        raise PhalanxError(f"{json_path} has other categories than the training split's", where)
    return cats


def _images(
    data: dict[str, Any], images_dir: Path, json_path: Path, where: str, bad: dict[str, str]
) -> tuple[list[dict[str, Any]], dict[int, tuple[int, int, str]]]:
    """The listed images whose files are there; the others go to ``bad`` with the reason."""
    images, sizes = [], {}
    for image in data["images"]:
        try:
            image_id, name = int(image["id"]), str(image["file_name"])
            width, height = int(image["width"]), int(image["height"])
        except (KeyError, TypeError, ValueError):
            raise PhalanxError(f"{json_path}: an image entry without id, file_name, width and height", where) from None
        path = images_dir / name
        if not path.resolve().is_relative_to(images_dir.resolve()):
            bad[name] = "its file_name leads out of images/"
        elif not path.is_file():
            bad[name] = f"is listed in {json_path.name} but not in {images_dir}"
        else:
            images.append({"id": image_id, "file_name": name, "width": width, "height": height})
            sizes[image_id] = (width, height, name)
    return images, sizes


def _boxes(
    data: dict[str, Any],
    known: set[int],
    sizes: dict[int, tuple[int, int, str]],
    json_path: Path,
    where: str,
    bad: dict[str, str],
) -> dict[int, list[tuple[list[float], int]]]:
    """Each image's boxes and categories; an image with a box outside it or of an undeclared
    category goes to ``bad``."""
    boxes: dict[int, list[tuple[list[float], int]]] = {image_id: [] for image_id in sizes}
    for annotation in data["annotations"]:
        try:
            image_id, category = int(annotation["image_id"]), int(annotation["category_id"])
            x, y, w, h = (float(v) for v in annotation["bbox"])
        except (KeyError, TypeError, ValueError):
            raise PhalanxError(
                f"{json_path}: annotation {annotation.get('id', '?')} has no image_id, category_id and "
                "bbox [x, y, w, h]",
                where,
            ) from None
        if image_id not in sizes or annotation.get("iscrowd", 0):
            continue  # an image left out above, or a crowd region (COCO scores these apart)
        width, height, name = sizes[image_id]
        if category not in known:
            bad.setdefault(
                name,
                f"annotation {annotation.get('id', '?')} has category {category}, which "
                f"{json_path.name} does not declare",
            )
        elif w <= 0 or h <= 0 or x < 0 or y < 0 or x + w > width + 0.5 or y + h > height + 0.5:
            bad.setdefault(
                name,
                f"annotation {annotation.get('id', '?')}'s box [{x:g}, {y:g}, {w:g}, {h:g}] is not "
                f"inside the {width}x{height} image",
            )
        else:
            boxes[image_id].append(([x, y, w, h], category))
    return boxes


class CocoImages(Dataset):
    """``(image, target)``: a float image in [0, 1] (C, H, W) as a ``tv_tensors.Image`` and a target
    with ``boxes`` (``tv_tensors.BoundingBoxes``, XYXY), ``labels`` (contiguous 1..K, 0 is the
    background) and ``image_id``; ``transform`` moves boxes with the image (v2 transforms)."""

    def __init__(self, split: CocoSplit, transform=None):
        self.split, self.transform = split, transform
        self.label_of = {c["id"]: i + 1 for i, c in enumerate(split.categories)}

    def __len__(self) -> int:
        return len(self.split.images)

    def __getitem__(self, index: int):
        from torchvision import tv_tensors

        info = self.split.images[index]
        path = self.split.images_dir / info["file_name"]
        try:
            pixels = decode(read_bounded(path), "RGB", None, fast=False)
        except Exception as exc:
            raise PhalanxError(f"cannot read image {path} ({type(exc).__name__}: {exc})"[:300], OPTION) from None
        height, width = pixels.shape[-2:]
        found = self.split.boxes[info["id"]]
        xyxy = torch.tensor([[x, y, x + w, y + h] for (x, y, w, h), _ in found], dtype=torch.float32).reshape(-1, 4)
        target = {
            "boxes": tv_tensors.BoundingBoxes(xyxy, format="XYXY", canvas_size=(height, width)),
            "labels": torch.tensor([self.label_of[c] for _, c in found], dtype=torch.int64),
            "image_id": info["id"],
        }
        image = tv_tensors.Image(pixels.float() / 255.0)
        if self.transform is not None:
            image, target = self.transform(image, target)
        return image, target


def collate(batch: list) -> tuple[list, list]:
    """Images and targets of a detection batch as lists: their sizes and box counts differ."""
    return [image for image, _ in batch], [target for _, target in batch]


ANNOTATIONS = "annotations.json"


@dataclass
class PredictedIds:
    """``predict``'s ``image_id`` and ``file_name`` of each image: the COCO annotations' (``source``),
    so pycocotools scores predict's JSON against them as it is, or the image's position and path."""

    ids: list[int]
    file_names: list[str]
    source: Path | None = None


def predicted_ids(paths: list[Path]) -> PredictedIds:
    """The ids of the first ``annotations.json`` beside the images (in their folder or up to two above,
    ``file_name`` relative to its ``images/`` or to itself) that names every image; else positions."""
    for folder in Path(os.path.abspath(paths[0])).parents[:3]:
        matched = _named_in(folder / ANNOTATIONS, paths)
        if matched is not None:
            return PredictedIds(
                [int(image["id"]) for image in matched],
                [str(image["file_name"]) for image in matched],
                folder / ANNOTATIONS,
            )
    return PredictedIds(list(range(len(paths))), [str(path) for path in paths])


def _named_in(annotations: Path, paths: list[Path]) -> list[dict[str, Any]] | None:
    """Each image's entry in ``annotations``; None unless it is COCO instances naming every image."""
    if not annotations.is_file():
        return None
    try:
        found = read_json(annotations, "IMAGES")
    except PhalanxError:  # not COCO instances: not the images' annotations
        return None
    roots = (annotations.parent / "images", annotations.parent)
    by_path = {
        os.path.abspath(root / str(image.get("file_name"))): image
        for image in found["images"]
        if isinstance(image, dict) and "id" in image
        for root in roots
    }
    matched = [image for image in (by_path.get(os.path.abspath(path)) for path in paths) if image]
    return matched if len(matched) == len(paths) else None
