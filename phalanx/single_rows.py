"""A training batch of one image through BatchNorm1d, refused before the run starts.

BatchNorm1d normalises each feature over the batch's rows; in training it refuses a single row
("Expected more than 1 value per channel"). A self-supervised head with BatchNorm1d (BYOL, SimSiam,
Barlow Twins, VICReg, MoCo v2) then failed at the last step of the first epoch whenever the training
images left one for a rank's last batch (81 images in batches of 8): an epoch's work lost, where the
batch size alone decides it, and a check at the start can say so. (BatchNorm2d over feature maps
larger than 1 x 1 takes one image.) A resume at another world size cuts the rest of its first epoch
elsewhere: that rest is checked too.
"""

from __future__ import annotations

from typing import Mapping

from torch import nn

from .config import RunConfig
from .errors import PhalanxError
from .sampling import last_micro_batch, smallest_share


def refuse_single_rows(cfg: RunConfig, train_samples: int, models: Mapping[str, nn.Module], world_size: int,
                       start: int = 0) -> None:
    """Refuse (``--batch-size``) a run whose rank would train BatchNorm1d on a batch of one row: in
    every epoch, or in the first one of a resume from sample ``start`` (another world size cuts it
    elsewhere)."""
    batch = cfg.optim.batch_size
    if train_samples < 1 or _fewest_rows(cfg, train_samples, start, batch, world_size) > 1:
        return
    found = next((f"{name}.{module_name}" if module_name else name for name, model in models.items()
                  for module_name, module in model.named_modules() if isinstance(module, nn.BatchNorm1d)), None)
    if found is None:
        return
    better = next((size for distance in range(1, 2 * batch + 2) for size in (batch - distance, batch + distance)
                   if size >= 1 and _fewest_rows(cfg, train_samples, start, size, world_size) > 1), None)
    ranks = f" over {world_size} ranks" if world_size > 1 else ""
    where = f"every epoch ({train_samples} training images{ranks})"
    if _rows(cfg, train_samples, batch, world_size) > 1:  # only the resumed epoch's rest is cut badly
        where = f"the epoch this resume continues ({train_samples - start} of {train_samples} training images left{ranks})"
    hint = f": {better}, say" if better else ""
    raise PhalanxError(f"{batch} leaves one image{' on a rank' if world_size > 1 else ''} for the last training "
                       f"batch of {where}, and BatchNorm1d ({found}) cannot train on one; choose a --batch-size that "
                       f"leaves at least two{hint}", "--batch-size")


def _fewest_rows(cfg: RunConfig, train_samples: int, start: int, batch: int, world_size: int) -> int:
    """The fewest rows of any epoch from here: the resumed one's rest (from ``start``) and the whole ones."""
    whole = _rows(cfg, train_samples, batch, world_size)
    return min(whole, _rows(cfg, train_samples - start, batch, world_size)) if 0 < start < train_samples else whole


def _rows(cfg: RunConfig, train_samples: int, batch: int, world_size: int) -> int:
    """The fewest rows one BatchNorm normalises over in an epoch of ``train_samples`` (or its rest): a
    rank's, or with ``--sync-bn`` every rank's together (a padding sample adds none)."""
    if cfg.devices.sync_bn and world_size > 1:
        return last_micro_batch(train_samples, batch, world_size)
    return smallest_share(train_samples, batch, world_size)
