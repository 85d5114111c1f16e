"""``--task deepliif``'s evaluation and prediction (translate's: every modality and the
segmentation, tiled, in DeepLIIF's output names) and its export as a DeepLIIF model directory."""

from __future__ import annotations

import copy
import csv
import functools
import io
import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import Dataset

from ...data.inputs import InputImages
from ...data.slides import Slide, SlideOutputs, SlideReader
from ...errors import PhalanxError
from ...records.pictures import pixels, png_bytes
from ...system.atomic import atomic_write_bytes, atomic_write_text
from ..inference import Predictor
from ..translate.inference import TranslateInference, TranslationPredictor
from ..translate.tiling import tile_overlap
from .cells import NOISE_THRESH, cell_data, count, deepliif_pixels, resolution_of
from .nets import without_running_statistics
from .slide_cells import SlideCells
from .tiles import Tiler
from .train_opt import DEEPLIIF_BACKGROUNDS

if TYPE_CHECKING:
    from ...config.inference import PredictOptions
    from .cyclegan import CycleGANTask
    from .ext import DeepLIIFExtTask
    from .task import DeepLIIFTask


class DeepLIIFInference(TranslateInference):
    task: DeepLIIFTask
    predict_options = TranslateInference.predict_options + (
        "tiling",
        "tile_size",
        "seg_weights",
        "seg_intermediate",
        "seg_thresh",
        "size_thresh",
        "size_thresh_upper",
        "marker_thresh",
    )

    def predictor(self, paths: list[Path], opts: PredictOptions, device: torch.device) -> Predictor:
        """DeepLIIF's tiling reads each image's 8-bit pixels as PIL decodes them (as DeepLIIF
        opens them); ``--tiling blend``, translate's inputs."""
        if opts.tiling == "blend":
            return super().predictor(paths, opts, device)
        inputs = InputImages(paths, self.info["mode"], lambda image: image, slides_above=opts.region_size, fast=False)
        generators = {name: self.models[name].to(device) for name in self.task.generator_names()}
        return self.predictor_class()(inputs, paths, device, generators, self, opts)

    def predictor_class(self) -> type[TranslationPredictor]:
        return CellCounter if self.task.counts_cells else DeepLIIFPictures

    def background_colors(self) -> list[tuple[int, int, int]]:
        """Each modality's colour for an empty tile: a DeepLIIF directory's ``background_colors``,
        else DeepLIIF's defaults."""
        return background_colors(self.task.modalities, self.info)

    def native_files(self, fmt: str) -> dict[str, Callable[[], bytes]] | None:
        """``export --format deepliif``: ``latest_net_<name>.pth`` per network (state dicts, as
        ``BaseModel.save_networks`` writes them), each generator traced as ``deepliif serialize``
        traces it (``<name>.pt``), and the ``train_opt.txt`` DeepLIIF reads to rebuild them
        (DeepLIIF 1.2's names: GS0 ... for the segmentation). Networks read from TorchScript files
        (a directory of serialize's ``G*.pt``) have no BatchNorm statistics to save: ``.pt`` only."""
        if fmt != "deepliif":
            return None
        files: dict[str, Callable[[], bytes]] = {}
        for name, model in self.models.items():
            if not isinstance(model, torch.jit.ScriptModule):  # serialize's networks lack BatchNorm's statistics
                files[f"latest_net_{name}.pth"] = functools.partial(state_bytes, model)
        for name in self.task.generator_names():
            files[f"{name}.pt"] = functools.partial(
                traced_bytes, self.models[name], self.info["channels"], self.info["size"]
            )
        files["train_opt.txt"] = lambda: train_opt(self.task, self.info).encode()
        return files


class NetworkFilesInference(TranslateInference):
    """DeepLIIFExt's and SDG's evaluation and prediction (translate's: each output tiled and
    blended, in ``deepliif test``'s folder names mod1 ..., Seg1 ...) and their export as a DeepLIIF
    model directory: ``latest_net_<name>.pth`` per network and ``train_opt.txt``."""

    task: DeepLIIFExtTask | CycleGANTask

    def predictor(self, paths: list[Path], opts: PredictOptions, device: torch.device) -> Predictor:
        """An SDG model of k input panels reads each image as k panels side by side, split as
        DeepLIIF's inference splits it (width / k each, the rest dropped), their channels together."""
        k = int(self.info.get("inputs", 1))
        if k == 1:
            return super().predictor(paths, opts, device)

        def panels(image: torch.Tensor) -> torch.Tensor:
            width = image.shape[-1] // k
            scaled = image[..., : width * k].float() / 127.5 - 1.0
            return torch.cat(scaled.split(width, dim=-1), 0)

        inputs = InputImages(paths, self.info["mode"], panels, slides_above=opts.region_size)
        generators = {name: self.models[name].to(device) for name in self.task.generator_names()}
        return self.predictor_class()(inputs, paths, device, generators, self, opts)

    def export_modules(self) -> dict[str, tuple[torch.nn.Module, torch.Tensor]]:
        size, channels = self.info["size"], self.info["channels"] * int(self.info.get("inputs", 1))
        example = torch.zeros(2, channels, size, size)
        return {name: (self.models[name], example) for name in self.task.generator_names()}

    def native_files(self, fmt: str) -> dict[str, Callable[[], bytes]] | None:
        if fmt != "deepliif":
            return None
        files: dict[str, Callable[[], bytes]] = {
            f"latest_net_{name}.pth": functools.partial(state_bytes, model) for name, model in self.models.items()
        }
        written = cyclegan_opt if self.task.deepliif_model == "CycleGAN" else network_files_opt
        files["train_opt.txt"] = lambda: written(self.task, self.info).encode()  # type: ignore[arg-type]
        return files


class CycleGANInference(NetworkFilesInference):
    """CycleGAN's: predict A -> B_i (``OUTPUT/GA_i/``); evaluate each A image's cycle, A -> B_i ->
    A, on DIR's ``valA/`` (else ``testA/``) and its B folders; export as NetworkFilesInference."""

    task: CycleGANTask

    def evaluation_split(self, split: Path) -> tuple[Dataset, str]:
        from ...data.pairs import PairTransform, Transformed
        from .unpaired import UnpairedImages, find_unpaired

        for name in ("val", "test"):
            files = find_unpaired(split, name, self.task.targets)
            if files is not None:
                size = self.info["size"]
                images = Transformed(UnpairedImages(files, size), PairTransform(size, train=False, flip=False))
                return images, f"{split / (name + 'A')} ({len(files)} images; their cycles A -> B -> A)"
        raise PhalanxError(
            f"{split} has no valA/ or testA/ (with valB1/ ... or testB1/ ...): evaluate scores CycleGAN's cycles on them",
            "--dataroot",
        )

    def results_table(self, results: dict[str, Any]) -> str:
        return "each cycle, A -> B_i -> A, against A\n" + super().results_table(results)


def state_bytes(model: torch.nn.Module) -> bytes:
    buffer = io.BytesIO()
    torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, buffer)
    return buffer.getvalue()


def traced_bytes(model: torch.nn.Module, channels: int, size: int) -> bytes:
    net = without_running_statistics(copy.deepcopy(model).float().eval())
    buffer = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchScript's deprecation (of trace and save) and tracer notes
        torch.jit.save(torch.jit.trace(net, torch.zeros(1, channels, size, size)), buffer)
    return buffer.getvalue()


class DeepLIIFPictures(TranslationPredictor):
    """Each image's modalities and segmentation (and ``--seg-intermediate``'s) as DeepLIIF writes
    them: tiled as ``deepliif test`` tiles (``tiles.Tiler``; ``--tiling blend``: translate's
    tiling), 8-bit as ``deepliif_pixels`` makes them (truncated, not rounded)."""

    inference: DeepLIIFInference

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # (TranslationPredictor's)
        super().__init__(*args, **kwargs)
        opts: PredictOptions = args[5] if len(args) > 5 else kwargs["opts"]
        task, info = self.inference.task, self.info
        self.tiling, self.intermediate = opts.tiling, opts.seg_intermediate
        self.seg_weights = tuple(opts.seg_weights) or None
        if self.seg_weights is not None and len(self.seg_weights) != task.modalities + 1:
            raise PhalanxError(
                f"has {len(self.seg_weights)} weight(s) where the input and {task.modalities} modalities need "
                f"{task.modalities + 1}",
                "--seg-weights",
            )
        self.tile_size = opts.tile_size or info["size"]
        given = opts.overlap_pixels()
        self.tiler = Tiler(
            self.tile_size,
            info["size"],
            self.run_tile,
            self.background,
            overlap=None if given is None else tile_overlap(given, self.tile_size),
        )

    def run_tile(self, tile: torch.Tensor) -> dict[str, np.ndarray]:
        """One tile through the networks, as ``deepliif test`` runs it."""
        task = self.inference.task
        outputs = task.test_outputs(
            self.generators, tile.to(self.device, self.dtype), self.seg_weights, self.intermediate
        )
        return {name: deepliif_pixels(out[0]) for name, out in outputs.items()}

    def background(self) -> dict[str, tuple[int, int, int]]:
        """An empty tile's outputs (DeepLIIF's ``run_wrapper``): each modality its background
        colour, the segmentations black."""
        task, colours = self.inference.task, self.inference.background_colors()
        out = {task.output_folder(i): colours[i] for i in range(task.modalities)}
        if task.seg:
            out["Seg"] = (0, 0, 0)
            if self.intermediate:
                out.update({f"{name}_s": (0, 0, 0) for name in task.modality_names()})
        return out

    def images(self, image: torch.Tensor) -> dict[str, np.ndarray]:
        """One image's outputs by folder, (H, W, 3) uint8."""
        if self.tiling == "blend":
            outputs = self.outputs(image.float() / 127.5 - 1.0 if not image.is_floating_point() else image)
            return {self.inference.task.output_folder(t): deepliif_pixels(out) for t, out in enumerate(outputs)}
        pixels = image.permute(1, 2, 0).numpy()
        return self.tiler.image(pixels[..., 0] if pixels.shape[2] == 1 else pixels)

    def predict_one(self, index: int, image: torch.Tensor) -> dict[str, np.ndarray]:  # type: ignore[override]
        if self.inference.looks_like_panels(image, self.info):
            self.panels.append(self.paths[index])
        arrays = self.images(image)
        for folder, array in arrays.items():
            target = self.output / folder / self.names[index]
            target.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(target, png_bytes(array))
        return arrays

    def array(self, output: torch.Tensor) -> np.ndarray:
        return deepliif_pixels(output)

    def write_regions(self, slide: Slide, reader: SlideReader, outputs: SlideOutputs) -> None:
        """With DeepLIIF's tiling, each region's pixels from the tiles the whole image takes them
        from (``Tiler.region``), so the slide's outputs are the whole image's; with ``--tiling
        blend``, translate's."""
        if self.tiling == "blend":
            self.inputs.prepare = lambda region: region.float() / 127.5 - 1.0
            return super().write_regions(slide, reader, outputs)

        def read(top: int, left: int, rows: int, cols: int) -> np.ndarray:
            pixels = reader.region(top, left, rows, cols).permute(1, 2, 0).numpy()
            return pixels[..., 0] if pixels.shape[2] == 1 else pixels

        step = self.region_size
        for top in range(0, slide.height, step):
            for left in range(0, slide.width, step):
                rows, cols = min(step, slide.height - top), min(step, slide.width - left)
                region = self.tiler.region(read, slide.height, slide.width, top, left, rows, cols)
                for folder, array in region.items():
                    outputs.write(folder, top, left, array)


class CellCounter(DeepLIIFPictures):
    """Predict, and count each image's cells as ``deepliif test`` counts them (DeepLIIF's
    ``postprocess``: the Seg image as written, the Marker image where a modality is named Marker,
    the magnification DeepLIIF assumes for the tile size, ``--seg-thresh`` ... ``--marker-thresh``):
    OUTPUT/cells.csv and cells.json (every field of DeepLIIF's per-image JSON), each cell in
    OUTPUT/cells/NAME.json (DeepLIIF's ``compute_cell_results``, version 3), and DeepLIIF's
    SegOverlaid/ (the input with each counted cell outlined) and SegRefined/ images. A slide's cells
    are counted block by block as in the whole image (``SlideCells``)."""

    fields = (
        "image",
        "num_total",
        "num_pos",
        "num_neg",
        "percent_pos",
        "seg_thresh",
        "size_thresh",
        "size_thresh_upper",
        "marker_thresh",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # (TranslationPredictor's)
        super().__init__(*args, **kwargs)
        opts: PredictOptions = args[5] if len(args) > 5 else kwargs["opts"]
        self.rows: list[dict[str, Any]] = []
        self.marker = self.inference.task.marker_folder()
        self.seg_thresh, self.thresholds = opts.seg_thresh, opts.thresholds()
        self.resolution = resolution_of(self.tile_size)

    def predict_one(self, index: int, image: torch.Tensor) -> dict[str, np.ndarray]:  # type: ignore[override]
        arrays = super().predict_one(index, image)
        seg, marker = arrays["Seg"], arrays[self.marker] if self.marker else None
        pixels = image.permute(1, 2, 0).numpy() if not image.is_floating_point() else pixels_of(image)
        images = {"input": np.repeat(pixels, 3, 2) if pixels.shape[2] == 1 else pixels}
        scoring = count(
            seg,
            marker,
            self.resolution,
            self.thresholds["size_thresh"],
            self.thresholds["marker_thresh"],
            self.thresholds["size_thresh_upper"],  # type: ignore[arg-type]
            self.seg_thresh,
            images_of=images,
        )
        self.rows.append({"image": str(self.names[index]), **{k: scoring[k] for k in self.fields[1:]}})
        for folder, key in (("SegOverlaid", "overlaid"), ("SegRefined", "refined")):
            target = self.output / folder / self.names[index]
            target.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(target, png_bytes(images[key]))
        data = cell_data(seg, marker, self.resolution, self.seg_thresh, NOISE_THRESH)
        target = (self.output / "cells" / self.names[index]).with_suffix(".json")
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(target, json.dumps(data) + "\n")
        return arrays

    def slide_predicted(self, index: int, slide: Slide, outputs: SlideOutputs, reader: SlideReader) -> None:
        cells = SlideCells(outputs, "Seg", self.marker, self.region_size, self.seg_thresh, NOISE_THRESH)
        for top, left, height, width in cells.blocks():
            cells.add_block(
                top,
                left,
                outputs.read("Seg", top, left, height, width),
                outputs.read(self.marker, top, left, height, width) if self.marker else None,
            )
        found = cells.found()
        t = self.thresholds
        scoring, counted, positive = cells.score(
            found, self.resolution, t["size_thresh"], t["marker_thresh"], t["size_thresh_upper"]
        )

        def input_region(top: int, left: int, height: int, width: int) -> np.ndarray:
            pixels = reader.region(top, left, height, width).permute(1, 2, 0).numpy()
            return np.repeat(pixels, 3, 2) if pixels.shape[2] == 1 else pixels

        cells.outline(found, counted, positive, input_region, "SegOverlaid", "SegRefined")
        self.rows.append({"image": str(self.slide_name(index)), **{k: scoring[k] for k in self.fields[1:]}})

    def finish(self) -> None:
        super().finish()
        if not self.rows:
            return
        table = io.StringIO()
        writer = csv.DictWriter(table, self.fields, lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.rows)
        atomic_write_text(self.output / "cells.csv", table.getvalue())
        atomic_write_text(self.output / "cells.json", json.dumps(self.rows, indent=1) + "\n")


def background_colors(modalities: int, info: dict) -> list[tuple[int, int, int]]:
    """Each modality's colour for an empty tile: those a DeepLIIF directory gave (``info``'s
    ``background_colors``), else DeepLIIF's defaults."""
    given = info.get("background_colors")
    if given and len(given) >= modalities:
        return [tuple(int(c) for c in colour) for colour in given[:modalities]]  # type: ignore[misc]
    return list(DEEPLIIF_BACKGROUNDS) if modalities == 4 else [(10, 10, 10)] * modalities


def pixels_of(image: torch.Tensor) -> np.ndarray:
    """An input in [-1, 1] (C, H, W) back to its 8-bit pixels (H, W, C)."""
    return np.asarray(pixels((image.float().cpu() + 1) / 2)).reshape(image.shape[1], image.shape[2], -1)


def network_files_opt(task: DeepLIIFExtTask, info: dict) -> str:
    """DeepLIIFExt's or SDG's options file: DeepLIIF's, with that model's networks and weights."""
    o, m = task.options, task.modalities
    inputs = int(info.get("inputs", 1))
    changes = {
        "model": task.deepliif_model,
        "seg_no": m if task.seg else 0,
        "input_no": inputs,
        "net_g": [o.net_g] * m,
        "net_gs": [o.net_gs] * m,
        "net_ds": "n_layers",
        "modalities_names": list(o.modalities_names)
        or [f"input{i + 1}" for i in range(inputs)] + [f"mod{i + 1}" for i in range(m)],
        "seg_weights": [1 / m] * m,
    }
    values = {**train_opt_values(task, info), **changes}
    del values["background_colors"]  # (DeepLIIF infers them for its own model's empty tiles)
    return options_text(values)


def cyclegan_opt(task: CycleGANTask, info: dict) -> str:
    """CycleGAN's options file: its networks, domains and weights as DeepLIIF names them."""
    o, m = task.options, task.targets
    values = {
        **network_opt(task, info),
        "model": "CycleGAN",
        "modalities_no": m,
        "modalities_names": ["input1"] + [f"mod{i + 1}" for i in range(m)],
        "seg_gen": False,
        "seg_no": 0,
        "net_g": [o.net_g] * m,
        "label_smoothing": o.label_smoothing,
        "pool_size": o.pool_size,
        "lambda_identity": 0,
        "BtoA": False,
        "dataset_mode": "unaligned",
    }
    return options_text(values)


def train_opt(task: DeepLIIFTask, info: dict) -> str:
    """DeepLIIF's options file (``print_options``' layout) for the networks as trained."""
    return options_text(train_opt_values(task, info))


def train_opt_values(task: DeepLIIFTask, info: dict) -> dict[str, Any]:
    o, m = task.options, task.modalities
    return {
        **network_opt(task, info),
        "model": "DeepLIIF",
        "modalities_no": m,
        "modalities_names": task.modality_names(),
        "seg_gen": task.seg,
        "seg_no": int(task.seg),
        "mod_id_seg": "S",
        "net_gs": o.net_gs,
        "seg_weights": list(task.weights.get("seg_weights", ())),
        "gan_mode_s": o.gan_mode_s,
        "lambda_L1": o.lambda_l1,
        "lambda_feat": o.lambda_feat,
        "background_colors": background_colors(m, info),
    }


def network_opt(task: DeepLIIFTask | CycleGANTask, info: dict) -> dict[str, Any]:
    """What every DeepLIIF model's options file says alike: the networks' shapes, the loss
    weights, the GAN objective and DeepLIIF's fixed settings."""
    o = task.options
    return {
        "input_no": 1,
        "input_nc": info["channels"],
        "output_nc": info["channels"],
        "netG": o.net_g,
        "net_d": "n_layers",
        "netD": "n_layers",
        "n_layers_D": o.d_layers,
        "ngf": o.ngf,
        "ndf": o.ndf,
        "norm": o.norm,
        "no_dropout": not o.dropout,
        "padding": o.padding,
        "upsample": "convtranspose",
        "scale_size": info["size"],
        "loss_G_weights": list(task.weights["loss_g_weights"]),
        "loss_D_weights": list(task.weights["loss_d_weights"]),
        "gan_mode": o.gan_mode,
        "gpu_ids": (),
        "init_type": "normal",
        "init_gain": 0.02,
        "optimizer": "adam",
        "phase": "train",
        "remote_transfer_cmd": None,
        "load_iter": 0,
        "verbose": False,
        "written_by": "phalanx export",
    }


def options_text(values: dict[str, Any]) -> str:
    lines = ["----------------- Options ---------------"]
    lines += [
        f"{key:>25}: {repr(value) if isinstance(value, str) else str(value):<30}"
        for key, value in sorted(values.items())
    ]
    return "\n".join(lines + ["----------------- End -------------------"]) + "\n"
