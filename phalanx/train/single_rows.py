"""A training batch of one image through BatchNorm1d, refused before the run starts.

BatchNorm1d normalises each feature over the batch's rows; in training it refuses a single row
("Expected more than 1 value per channel"). A self-supervised head with BatchNorm1d (BYOL, SimSiam,
Barlow Twins, VICReg, MoCo v2) then failed at the last step of the first epoch whenever the training
images left one for a rank's last batch (81 images in batches of 8): an epoch's work lost, where the
batch size alone decides it, and a check at the start can say so. (BatchNorm2d over feature maps
larger than 1 x 1 takes one image.) A resume at another world size cuts the rest of its first epoch
elsewhere, and DataParallel cuts each batch over its GPUs: both are checked too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from torch import nn

from ..config import RunConfig
from ..data.sampling import last_micro_batch, smallest_share
from ..errors import PhalanxError


def refuse_single_rows(
    cfg: RunConfig,
    train_samples: int,
    models: Mapping[str, nn.Module],
    world_size: int,
    start: int = 0,
    replicas: int = 1,
) -> None:
    """Refuse (``--batch-size``) a run whose rank would train BatchNorm1d on a batch of one row: in
    every epoch, or in the first one of a resume from sample ``start`` (another world size cuts it
    elsewhere), or on one of DataParallel's ``replicas`` (its split of a batch)."""
    batch = cfg.optim.batch_size
    cut = _Cut(world_size, replicas, cfg.devices.sync_bn)
    if train_samples < 1 or cut.fewest_rows(train_samples, start, batch) > 1:
        return
    found = next(
        (
            f"{name}.{module_name}" if module_name else name
            for name, model in models.items()
            for module_name, module in model.named_modules()
            if isinstance(module, nn.BatchNorm1d)
        ),
        None,
    )
    if found is None:
        return
    better = next(
        (
            size
            for distance in range(1, 2 * batch + 2)
            for size in (batch - distance, batch + distance)
            if size >= 1 and cut.fewest_rows(train_samples, start, size) > 1
        ),
        None,
    )
    ranks = f" over {world_size} ranks" if world_size > 1 else ""
    where = f"the last training batch of every epoch ({train_samples} training images{ranks})"
    fix = "choose a --batch-size that leaves at least two" + (f": {better}, say" if better else "")
    resumed_rest = cut.rows(train_samples, batch) > 1  # only the resumed epoch's rest is cut badly
    if resumed_rest:
        where = (
            f"the last training batch of the epoch this resume continues ({train_samples - start} of "
            f"{train_samples} training images left{ranks})"
        )
        # A resume keeps the run's --batch-size: the number of processes is what can change.
        processes = next(
            (
                w
                for d in range(1, 2 * world_size + 1)
                for w in (world_size - d, world_size + d)
                if w >= 1 and replace(cut, world_size=w).fewest_rows(train_samples, start, batch) > 1
            ),
            None,
        )
        fix = f"resume in a number of processes that leaves at least two{f': {processes}, say' if processes else ''}"
    on = " on a rank" if world_size > 1 else ""
    if replicas > 1:
        on, where = (
            " on a GPU",
            (f"a training batch (DataParallel splits each over {replicas} GPUs; {train_samples} training images)"),
        )
        if resumed_rest:  # one process: the GPUs that share its batch are what can change
            fix = "resume on another number of GPUs (--gpu-ids) that leaves at least two a GPU"
    raise PhalanxError(
        f"{batch} leaves one image{on} for {where}, and BatchNorm1d ({found}) cannot train on one; {fix}",
        "--batch-size",
    )


def smallest_chunk(rows: int, replicas: int) -> int:
    """The fewest rows DataParallel gives a replica of a batch of ``rows``: its scatter cuts the batch
    as ``Tensor.chunk`` does (pieces of ceil(rows / replicas); the last holds what is left)."""
    piece = -(-rows // replicas)
    return rows - piece * (-(-rows // piece) - 1)


@dataclass(frozen=True)
class _Cut:
    """How an epoch's samples reach each BatchNorm: over ranks, and over DataParallel's replicas."""

    world_size: int
    replicas: int
    sync_bn: bool

    def fewest_rows(self, train_samples: int, start: int, batch: int) -> int:
        """The fewest rows of any epoch from here: the resumed one's rest (from ``start``) and the whole ones."""
        whole = self.rows(train_samples, batch)
        return min(whole, self.rows(train_samples - start, batch)) if 0 < start < train_samples else whole

    def rows(self, train_samples: int, batch: int) -> int:
        """The fewest rows one BatchNorm normalises over in an epoch of ``train_samples`` (or its rest):
        a rank's, with ``--sync-bn`` every rank's together (a padding sample adds none), under
        DataParallel a replica's share of a full batch or of the last one."""
        if self.sync_bn and self.world_size > 1:
            return last_micro_batch(train_samples, batch, self.world_size)
        share = smallest_share(train_samples, batch, self.world_size)
        if self.replicas == 1:
            return share
        sizes = [share] + ([batch] if train_samples >= batch else [])
        return min(smallest_chunk(rows, self.replicas) for rows in sizes)
