"""``--task translate``'s evaluation (L1, PSNR and SSIM per target), predictions (each image
translated whole, tiled at the training size, to a folder of PNGs per target) and export."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from ...data.inputs import InputImages, output_names
from ...data.pairs import PairFiles, PairTransform, Transformed, find_pairs
from ...data.slides import Slide, SlideOutputs, SlideReader, SlideUnreadable, slide_of
from ...errors import PhalanxError
from ...records.pictures import pixels, png_bytes
from ...system.atomic import atomic_write_bytes
from ..base import Evaluation
from ..inference import Inference, Predictor
from .tiling import tile_overlap, tiled

if TYPE_CHECKING:
    from ...config.inference import PredictOptions
    from .task import TranslateTask


class TranslateInference(Inference):
    task: TranslateTask
    predict_options: tuple[str, ...] = ("tile_overlap", "region_size")

    def evaluation_split(self, split: Path) -> tuple[Dataset, str]:
        pairs = find_pairs(split, self.task.data_targets(), skip_broken=False, last=self.task.last_target_folder)
        size = self.info["size"]
        return Transformed(
            PairFiles(pairs), PairTransform(size, train=False, flip=False)
        ), f"{split} ({len(pairs)} {pairs.layout} pairs)"

    def results(self, evaluation: Evaluation) -> dict[str, Any]:
        return {"images": evaluation.extra["samples"], "targets": self.task.targets}

    def results_table(self, results: dict[str, Any]) -> str:
        m = results["metrics"]
        lines = [f"images {results['images']}", "", f"{'target':<8} {'L1':>8} {'PSNR (dB)':>10} {'SSIM':>8}"]
        for t in range(self.task.targets):  # named as predict's folders (DeepLIIF's: Hema, ..., Seg)
            s = self.task.suffix(t)
            lines.append(
                f"{self.task.output_folder(t):<8} {m[f'L1{s}']:>8.4f} {m[f'PSNR{s}']:>10.2f} {m[f'SSIM{s}']:>8.4f}"
            )
        if self.task.targets > 1:
            lines.append(f"{'mean':<8} {m['L1']:>8.4f} {m['PSNR']:>10.2f} {m['SSIM']:>8.4f}")
        return "\n".join(lines)

    def check_predict_output(self, output: str) -> None:
        path = Path(output)
        if path.suffix:
            raise PhalanxError(
                f"is a folder for --task translate (one subfolder of PNGs per target), not a file ({path.name})",
                "--output",
            )
        if path.exists() and not path.is_dir():
            raise PhalanxError(f"{path} exists and is not a folder", "--output")

    def predictor(self, paths: list[Path], opts: PredictOptions, device: torch.device) -> Predictor:
        """Each image translated at its own size (tiles of the training size, blended where they
        overlap), written as PNG to OUTPUT/target<N>/<name>.png, <name> keeping the image's folders
        below the deepest folder holding every input (``output_names``); a TIFF larger than
        ``--region-size`` (a whole slide) region by region, to OUTPUT/target<N>/<name>.ome.tif."""
        inputs = InputImages(
            paths, self.info["mode"], lambda image: image.float() / 127.5 - 1.0, slides_above=opts.region_size
        )
        generators = {name: self.models[name].to(device) for name in self.task.generator_names()}
        return self.predictor_class()(inputs, paths, device, generators, self, opts)

    def predictor_class(self) -> type[TranslationPredictor]:
        return TranslationPredictor

    def looks_like_panels(self, image: torch.Tensor, info: dict[str, Any]) -> bool:
        """An input and its targets side by side (the aligned layout's files), not an input alone."""
        return info.get("layout") != "plain" and image.shape[-1] == (self.task.targets + 1) * image.shape[-2]

    def warn_of_panels(self, panels: list[Path]) -> None:
        if panels:
            count = self.task.targets + 1
            print(
                f"phalanx: warning: {len(panels)} image(s) are {count} square panels side by side (width = {count} "
                f"x height, the aligned training data's input|target layout), e.g. {panels[0]}: each was "
                "translated whole; give predict the input panel (the left one) alone",
                file=sys.stderr,
                flush=True,
            )

    def export_modules(self) -> dict[str, tuple[nn.Module, torch.Tensor]]:
        size, channels = self.info["size"], self.info["channels"]
        example = torch.zeros(2, channels, size, size)
        return {name: (self.models[name], example) for name in self.task.generator_names()}

    def export_metadata(self) -> dict[str, Any]:
        info = self.info
        return {
            "input": "RGB" if info["channels"] == 3 else "grayscale",
            "image_size": info["size"],
            "scale": "pixels / 127.5 - 1 (inputs and outputs in [-1, 1])",
            "outputs": "the translated image, (output + 1) * 127.5 for pixels",
            "sides": f"multiples of {info['size']} for a U-Net; tile larger images as phalanx predict does",
        }


class TranslationPredictor(Predictor):
    inputs: InputImages

    def __init__(
        self,
        inputs: InputImages,
        paths: list[Path],
        device: torch.device,
        generators: dict[str, nn.Module],
        inference: TranslateInference,
        opts: PredictOptions,
    ):
        super().__init__(inputs, paths, device)
        self.generators, self.inference, self.info = generators, inference, inference.info
        self.names = output_names(paths)  # before any work: two images never share an output
        slides = [self.slide_name(i) for i, p in enumerate(paths) if slide_of(p, opts.region_size)]  # (headers)
        if len(set(slides)) != len(slides):
            twice = next(name for name in slides if slides.count(name) > 1)
            raise PhalanxError(
                f"two slides would both be written as {twice}; predict them in separate runs (or rename one)", "IMAGES"
            )
        self.overlap = tile_overlap(opts.overlap_pixels(), self.info["size"])
        self.region_size = opts.region_size
        self.output = Path(opts.output)
        self.panels: list[Path] = []

    def predict(self, indices: list[int], images: list[torch.Tensor | Slide], raws: list) -> None:
        for index, image in zip(indices, images):
            if isinstance(image, Slide):
                self.predict_slide(index, image)
            else:
                self.predict_one(index, image)

    def predict_one(self, index: int, image: torch.Tensor) -> list[torch.Tensor]:
        """Write one image's outputs (PNGs of what ``pictures.pixels`` makes of them); return them."""
        if self.inference.looks_like_panels(image, self.info):
            self.panels.append(self.paths[index])
        outputs = self.outputs(image)
        for t, out in enumerate(outputs):
            target = self.output / self.inference.task.output_folder(t) / self.names[index]
            data = self.picture(out)
            target.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(target, data)
        return outputs

    def picture(self, output: torch.Tensor) -> bytes:
        """An output in [-1, 1] as PNG bytes."""
        return png_bytes(self.array(output))

    def array(self, output: torch.Tensor) -> np.ndarray:
        """An output in [-1, 1] as the pixels written, (H, W) or (H, W, 3) uint8."""
        return pixels((output.float().cpu() + 1) / 2)

    def predict_slide(self, index: int, slide: Slide) -> None:
        """A slide predicted region by region (``write_regions``) into ``SlideOutputs``, then
        written as OME-TIFF; an unreadable slide is reported and nothing of it is written."""
        name = self.names[index]
        outputs = SlideOutputs(self.output / f".{name.name}.partial", slide.height, slide.width)
        try:
            with SlideReader(slide, self.info["mode"]) as reader:
                self.write_regions(slide, reader, outputs)
                self.slide_predicted(index, slide, outputs, reader)
            for folder in outputs.outputs():
                outputs.finish(folder, self.output / folder / self.slide_name(index))
        except SlideUnreadable as exc:
            self.unreadable.append((slide.path, str(exc)))
        finally:
            outputs.discard()

    def write_regions(self, slide: Slide, reader: SlideReader, outputs: SlideOutputs) -> None:
        """Every region's outputs, with what whole-image prediction computes: each region starts
        at a multiple of the tile stride, so the tiles fall where they fall in the whole image, and
        is read with the pixels around it that its tiles cover (``before``: the tiles starting
        within a tile before it; ``overlap`` after it); the region's part of every output is kept."""
        size, overlap = self.info["size"], max(0, min(self.overlap, self.info["size"] - 1))
        stride = size - overlap
        before = (-(-size // stride) - 1) * stride
        region = max(stride, self.region_size // stride * stride)
        for top in range(0, slide.height, region):
            for left in range(0, slide.width, region):
                height, width = min(region, slide.height - top), min(region, slide.width - left)
                t0, l0 = (
                    start(begin, total, size, stride, before)
                    for begin, total in ((top, slide.height), (left, slide.width))
                )
                t1, l1 = (
                    after(end, total, size, overlap)
                    for end, total in ((top + height, slide.height), (left + width, slide.width))
                )
                window = self.inputs.prepare(reader.region(t0, l0, t1 - t0, l1 - l0)).to(self.dtype)
                core = (..., slice(top - t0, top - t0 + height), slice(left - l0, left - l0 + width))
                for t, out in enumerate(self.outputs(window)):
                    outputs.write(self.inference.task.output_folder(t), top, left, self.array(out[core]))

    def slide_name(self, index: int) -> Path:
        """Where a slide's outputs go in each output folder: its name as an OME-TIFF."""
        name = self.names[index]
        stem = name.name[: -len(".ome.png")] if name.name.endswith(".ome.png") else name.stem
        return name.with_name(f"{stem}.ome.tif")

    def slide_predicted(self, index: int, slide: Slide, outputs: SlideOutputs, reader: SlideReader) -> None:
        """What a task adds to a slide's outputs once every region is predicted (nothing here)."""

    def outputs(self, image: torch.Tensor) -> list[torch.Tensor]:
        """Every target's output for one image of any size: all of them per tile, in one pass."""
        widths: list[int] = []

        def all_outputs(tile: torch.Tensor) -> torch.Tensor:
            outputs = self.inference.task.generate(self.generators, tile)
            widths[:] = [o.shape[1] for o in outputs]
            return torch.cat(outputs, 1)

        joined = tiled(all_outputs, image[None].to(self.device), self.info["size"], self.overlap)[0]
        return list(joined.split(widths, 0))

    def finish(self) -> None:
        self.inference.warn_of_panels(self.panels)


def start(begin: int, total: int, size: int, stride: int, before: int) -> int:
    """Where a slide region starting at ``begin`` (of ``total``) is read from: the tiles that start
    within a tile before it, and the whole image's last tile (it starts at ``total - size``, off
    the stride, and reaches into a region thinner than a tile at the slide's end); on the stride's grid."""
    return max(0, min(begin - before, (total - size) // stride * stride))


def after(end: int, total: int, size: int, overlap: int) -> int:
    """Where a slide region ending at ``end`` (of ``total``) is read to: the overlap of its last tiles,
    or the slide's end where the whole image's last tile (which ends there) reaches into the region."""
    return total if total - size < end else min(total, end + overlap)
