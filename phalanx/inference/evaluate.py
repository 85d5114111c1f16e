"""``phalanx evaluate``: a checkpoint's validation metrics, as its task computes them, on the run's
own validation split (reproducing what training recorded) or on other data. Started inside a
process group (torchrun, SLURM, MPI), the ranks share the data and every sample is counted once,
as in training's validation.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from ..config.inference import EvaluateOptions
from ..data import loader_workers
from ..data.sampling import ShardSampler, every_batch
from ..distributed.devices import placement
from ..distributed.strategies import strategy_for
from ..errors import PhalanxError
from ..system.atomic import atomic_write_text
from ..tasks.base import dataset_size
from ..train.context import DeviceContext
from ..train.progress import ProgressBar
from .model import load_trained
from .outputs import check_file, evaluate_results


def config_changes(opts: EvaluateOptions) -> dict[str, Any]:
    """This command's devices, batch size and data over the training configuration."""
    changes: dict[str, Any] = {
        "gpu_ids": opts.gpu_ids,
        "num_workers": opts.num_workers,
        "resume": None,
        "overwrite": False,
        "sync_bn": False,
        "strategy": "ddp",
    }  # (whole networks)
    if opts.batch_size:
        changes["batch_size"] = opts.batch_size
    if opts.dataroot:
        changes.update(dataroot=opts.dataroot, dataset=opts.dataset or "folder")
    return changes


def shown(batches: Iterator[Any], bar: ProgressBar, samples: int, batch_size: int) -> Iterator[Any]:
    """The batches of ``samples`` images, each counted on the progress bar as it is taken."""
    try:
        for index, batch in enumerate(batches):
            yield batch
            bar.update(min(batch_size, samples - index * batch_size))
    finally:
        bar.close()


def evaluate(opts: EvaluateOptions) -> dict[str, Any]:
    if opts.output:  # before any work: a missing folder or a file not ours is refused now, not after
        check_file(Path(opts.output), opts.checkpoint, opts.overwrite, evaluate_results, "a results JSON")
    # The trained task (its networks and its own state) with this command's data,
    # batch and devices.
    trained = load_trained(
        opts.checkpoint, opts.ema, config_changes(opts), {"knn_k": opts.knn_k} if opts.knn_k else None
    )
    cfg, task = trained.config, trained.task
    recorded = cfg.data.dataroot
    if not opts.dataroot and recorded and not Path(recorded).exists():
        raise PhalanxError(
            f"the run's data, recorded in the checkpoint as {recorded}, is not there; pass --dataroot "
            "DIR to evaluate on data elsewhere",
            "--dataroot",
        )
    with strategy_for(cfg, placement()) as strategy:
        inference = trained.inference()
        dataset, what = inference.evaluation_data(opts.dataroot, opts.dataset)
        models = {name: model.to(strategy.device) for name, model in trained.models.items()}
        if cfg.network.channels_last:
            models = {name: model.to(memory_format=torch.channels_last) for name, model in models.items()}
        workers = loader_workers(cfg.data.num_workers, strategy.local_world_size, strategy.training_threads)
        sampler = ShardSampler(dataset_size(dataset), strategy.rank, strategy.world_size)
        loader = DataLoader(
            dataset,
            batch_size=cfg.optim.batch_size,
            num_workers=workers,
            collate_fn=inference.eval_collate,
            sampler=sampler,
        )
        ctx = DeviceContext(strategy, cfg.optim.precision, cfg.network.channels_last)
        bar = ProgressBar(len(loader), "evaluate", opts.progress and strategy.is_main)
        batches = shown(every_batch(loader, "evaluation"), bar, len(sampler), cfg.optim.batch_size)
        evaluation = task.evaluate(models, batches, ctx)
        if not evaluation.extra.get("samples", 1):
            raise PhalanxError("no image to evaluate", "--dataroot")
        # The checkpoint's absolute path: the JSON is read from elsewhere (a newcomer found a relative one).
        results = {
            "checkpoint": str(trained.path.resolve()),
            "data": what,
            "task": cfg.task,
            "world_size": strategy.world_size,
            "metrics": evaluation.metrics,
            **inference.results(evaluation),
        }
        if strategy.is_main:
            # The header is evaluate's, the same for every task (a user's own included); the table is the task's.
            print(f"{results['checkpoint']} on {results['data']}\n{inference.results_table(results)}")
            if opts.output:
                atomic_write_text(Path(opts.output), json.dumps(results, indent=2) + "\n")
        return results
