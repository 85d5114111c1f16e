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
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ...data.slides import Slide, SlideOutputs, SlideReader
from ...records.pictures import pixels, png_bytes
from ...system.atomic import atomic_write_bytes, atomic_write_text
from ..translate.inference import TranslateInference, TranslationPredictor
from .cells import NOISE_THRESH, SEG_THRESH, count, deepliif_pixels, resolution_of
from .nets import without_running_statistics
from .slide_cells import SlideCells

if TYPE_CHECKING:
    from .task import DeepLIIFTask


class DeepLIIFInference(TranslateInference):
    task: DeepLIIFTask

    def predictor_class(self) -> type[TranslationPredictor]:
        return CellCounter if self.task.counts_cells else DeepLIIFPictures

    def native_files(self, fmt: str) -> dict[str, Callable[[], bytes]] | None:
        """``export --format deepliif``: ``latest_net_<name>.pth`` per network (state dicts, as
        ``BaseModel.save_networks`` writes them), each generator traced as ``deepliif serialize``
        traces it (``<name>.pt``), and the ``train_opt.txt`` DeepLIIF reads to rebuild them
        (DeepLIIF 1.2's names: GS0 ... for the segmentation)."""
        if fmt != self.task.name:
            return None
        files: dict[str, Callable[[], bytes]] = {}
        for name, model in self.models.items():
            files[f"latest_net_{name}.pth"] = functools.partial(state_bytes, model)
        for name in self.task.generator_names():
            files[f"{name}.pt"] = functools.partial(
                traced_bytes, self.models[name], self.info["channels"], self.info["size"]
            )
        files["train_opt.txt"] = lambda: train_opt(self.task, self.info).encode()
        return files


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
    """Outputs written as DeepLIIF writes them (``deepliif_pixels``: truncated, not rounded)."""

    def array(self, output: torch.Tensor) -> np.ndarray:
        return deepliif_pixels(output)


class CellCounter(DeepLIIFPictures):
    """Predict as translate does, and count each image's cells as DeepLIIF's ``postprocess`` does
    (``cells``: the Seg image as written, the Marker image where there are DeepLIIF's 4
    modalities, the resolution DeepLIIF assumes for the tile size): OUTPUT/cells.csv and cells.json,
    and DeepLIIF's SegOverlaid/ (the input with each counted cell outlined) and SegRefined/ images.
    A slide's cells are counted block by block as in the whole image (``deepliif_slide_cells``)."""

    fields = ("image", "num_total", "num_pos", "num_neg", "percent_pos", "size_thresh", "seg_thresh", "marker_thresh")
    inference: DeepLIIFInference

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # (TranslationPredictor's)
        super().__init__(*args, **kwargs)
        self.rows: list[dict[str, Any]] = []
        task = self.inference.task
        self.seg = task.output_folder(task.modalities)
        self.marker: str | None = task.output_folder(task.modalities - 1)
        if self.marker != "Marker":
            self.marker = None

    def predict_one(self, index: int, image: torch.Tensor) -> list[torch.Tensor]:
        outputs = super().predict_one(index, image)
        task = self.inference.task
        seg = deepliif_pixels(outputs[task.modalities])
        marker = deepliif_pixels(outputs[task.modalities - 1]) if self.marker else None
        images = {"input": pixels((image.float().cpu() + 1) / 2)}
        scoring = count(seg, marker, resolution_of(self.info["size"]), images_of=images)
        self.rows.append({"image": str(self.names[index]), **{k: scoring[k] for k in self.fields[1:]}})
        for folder, key in (("SegOverlaid", "overlaid"), ("SegRefined", "refined")):
            target = self.output / folder / self.names[index]
            target.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(target, png_bytes(images[key]))
        return outputs

    def slide_predicted(self, index: int, slide: Slide, outputs: SlideOutputs, reader: SlideReader) -> None:
        cells = SlideCells(outputs, self.seg, self.marker, self.region_size, SEG_THRESH, NOISE_THRESH)
        for top, left, height, width in cells.blocks():
            cells.add_block(
                top,
                left,
                outputs.read(self.seg, top, left, height, width),
                outputs.read(self.marker, top, left, height, width) if self.marker else None,
            )
        found = cells.found()
        scoring, counted, positive = cells.score(found, resolution_of(self.info["size"]), "default", None, None)

        def input_region(top: int, left: int, height: int, width: int) -> np.ndarray:
            return reader.region(top, left, height, width).permute(1, 2, 0).numpy()

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


def train_opt(task: DeepLIIFTask, info: dict) -> str:
    """DeepLIIF's options file (``print_options``' layout) for the networks as trained."""
    o, m = task.options, task.modalities
    names = ["IHC", "Hema", "DAPI", "Lap2", "Marker"] if m == 4 else ["input1"] + [f"mod{k + 1}" for k in range(m)]
    values = {
        "model": "DeepLIIF",
        "modalities_no": m,
        "modalities_names": names,
        "seg_gen": task.seg,
        "seg_no": int(task.seg),
        "input_no": 1,
        "mod_id_seg": "S",
        "input_nc": info["channels"],
        "output_nc": info["channels"],
        "netG": o.net_g,
        "net_gs": o.net_gs,
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
        "seg_weights": list(task.weights["seg_weights"]),
        "loss_G_weights": list(task.weights["loss_g_weights"]),
        "loss_D_weights": list(task.weights["loss_d_weights"]),
        "gan_mode": o.gan_mode,
        "gan_mode_s": o.gan_mode_s,
        "lambda_L1": o.lambda_l1,
        "lambda_feat": o.lambda_feat,
        "gpu_ids": (),
        "init_type": "normal",
        "init_gain": 0.02,
        "optimizer": "adam",
        "phase": "train",
        "remote_transfer_cmd": None,
        "load_iter": 0,
        "verbose": False,
        "background_colors": [(201, 211, 208), (10, 10, 10), (0, 0, 0), (10, 10, 10)] if m == 4 else [(10, 10, 10)] * m,
        "written_by": "phalanx export",
    }
    lines = ["----------------- Options ---------------"]
    lines += [
        f"{key:>25}: {repr(value) if isinstance(value, str) else str(value):<30}"
        for key, value in sorted(values.items())
    ]
    return "\n".join(lines + ["----------------- End -------------------"]) + "\n"
