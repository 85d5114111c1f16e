"""The trainer's checkpoints, a part it holds: what a checkpoint holds (the run's stateful parts and
the position in training), what a resume restores, and writing them (every rank its shards under
``--strategy fsdp``; rank 0 the files, off the training thread). torchtitan's ``CheckpointManager``
pattern: the trainer calls it with the position to save, never lends it itself."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import checkpoint
from ..checkpoint import sharded as sharded_checkpoint
from ..checkpoint.writer import CheckpointWriter
from ..config import RunConfig
from ..distributed.strategy import Strategy
from .best import Best
from .state import RunState


@dataclass
class Progress:
    """Where training is: epochs completed, samples of the next epoch consumed over all ranks
    (mid-epoch checkpoints), and optimizer steps taken (a count for logs)."""

    epoch: int = 0
    position: int = 0
    step: int = 0


class Checkpointer:
    def __init__(
        self,
        cfg: RunConfig,
        strategy: Strategy,
        parts: RunState,
        best: Best,
        writer: CheckpointWriter,
        primary: str,
        run_id: str,
        data_info: dict[str, Any],
    ):
        self.cfg, self.strategy, self.parts, self.best, self.writer = cfg, strategy, parts, best, writer
        self.primary, self.run_id, self.data_info = primary, run_id, data_info

    def state_dict(self, progress: Progress) -> dict[str, Any]:
        parts = self.parts.state_dict()
        # "model": the primary network again, for readers of the file alone (a sharded one names it)
        named = {"model": parts["models"][self.primary]} if "models" in parts else {"primary": self.primary}
        return {
            **parts,
            "task": self.cfg.task,
            "epoch": progress.epoch,
            "position": progress.position,
            "step": progress.step,
            "world_size": self.strategy.world_size,
            "effective_batch": self.strategy.plan.effective_batch,
            "run_id": self.run_id,
            **named,
            "config": self.cfg.to_dict(),
            "data": self.data_info,
        }

    def restore(self, state: dict[str, Any]) -> Progress:
        self.parts.load_state_dict(state)
        return Progress(state["epoch"], state["position"], state["step"])

    def save_epoch(self, progress: Progress, metrics: dict[str, float] | None) -> None:
        """An epoch's end: latest.pt, best.pt where its metrics improve on the best, and a numbered
        copy every --save-epoch-freq epochs."""
        run_dir = self.cfg.run_dir
        paths = [run_dir / checkpoint.LATEST]
        if metrics is not None and self.best.improves(metrics):
            paths.append(run_dir / checkpoint.BEST)
        if self.cfg.output.save_epoch_freq and progress.epoch % self.cfg.output.save_epoch_freq == 0:
            paths.append(run_dir / checkpoint.epoch_name(progress.epoch))
        self.write(paths, progress)

    def save_latest(self, progress: Progress) -> None:
        """Mid-epoch (a stop, --max-steps): latest.pt alone."""
        self.write([self.cfg.run_dir / checkpoint.LATEST], progress)

    def write(self, paths: list[Path], progress: Progress) -> None:
        """Every rank: its shards where each writes its own; then rank 0 the files (off the training
        thread), with the state every rank helped gather under FSDP."""
        shards = {}
        if self.strategy.writes_shards:
            self.collect_shards()
            shards["sharded"] = sharded_checkpoint.save(
                self.cfg.run_dir,
                f"epoch{progress.epoch:04d}-step{progress.step:08d}",
                self.parts.bare_models(),
                self.parts.optimizers,
                self.strategy,
            )
        state = self.state_dict(progress) if self.strategy.is_main or self.strategy.gathers_state else None
        if self.strategy.is_main:
            assert state is not None  # (rank 0 always makes it)
            self.writer.save(paths, {**state, **shards})

    def collect_shards(self) -> None:
        """Rank 0, once every file is written: remove the shards no checkpoint names any more (also
        after a sharded run was resumed under another strategy, whose files name none)."""
        if self.strategy.is_main and (
            self.strategy.writes_shards or (self.cfg.run_dir / sharded_checkpoint.SHARDS).is_dir()
        ):
            self.writer.wait()
            sharded_checkpoint.collect(self.cfg.run_dir)
