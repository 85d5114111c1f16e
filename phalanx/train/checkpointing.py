"""The trainer's checkpoints: the state a checkpoint holds, what a resume restores, and writing
them (every rank its shards under ``--strategy fsdp``; rank 0 the files, off the training thread).
``Trainer`` mixes it in; it reads the trainer's parts, progress and writer."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import checkpoint
from ..checkpoint import sharded as sharded_checkpoint

if TYPE_CHECKING:
    from .trainer import Trainer


class Checkpointing:
    def state_dict(self: Trainer) -> dict[str, Any]:
        parts, primary = self.parts.state_dict(), self.declared.primary_model
        # "model": the primary network again, for readers of the file alone (a sharded one names it)
        named = {"model": parts["models"][primary]} if "models" in parts else {"primary": primary}
        return {**parts, "task": self.cfg.task, "epoch": self.epoch, "position": self.position, "step": self.step,
                "world_size": self.world_size, "effective_batch": self.strategy.plan.effective_batch,
                "run_id": self.run_id, **named, "config": self.cfg.to_dict(), "data": self.data_info}

    def restore(self: Trainer, state: dict[str, Any]) -> None:
        self.parts.load_state_dict(state)
        self.epoch, self.step, self.position = state["epoch"], state["step"], state["position"]

    def _save(self: Trainer, metrics: dict[str, float] | None) -> None:
        run_dir = self.cfg.run_dir
        paths = [run_dir / checkpoint.LATEST]
        if metrics is not None and self.best.improves(metrics):
            paths.append(run_dir / checkpoint.BEST)
        if self.cfg.output.save_epoch_freq and self.epoch % self.cfg.output.save_epoch_freq == 0:
            paths.append(run_dir / checkpoint.epoch_name(self.epoch))
        self._write_checkpoint(paths)

    def _write_checkpoint(self: Trainer, paths: list[Path]) -> None:
        """Every rank: its shards where each writes its own; then rank 0 the files (off the training
        thread), with the state every rank helped gather under FSDP."""
        shards = {}
        if self.strategy.writes_shards:
            self._collect_shards()
            shards["sharded"] = sharded_checkpoint.save(self.cfg.run_dir, f"epoch{self.epoch:04d}-step{self.step:08d}",
                                                        self.bare_models(), self.optimizers, self.strategy)
        state = self.state_dict() if self.strategy.is_main or self.strategy.gathers_state else None
        if self.strategy.is_main:
            self.writer.save(paths, {**state, **shards})

    def _collect_shards(self: Trainer) -> None:
        """Rank 0, once every file is written: remove the shards no checkpoint names any more (also
        after a sharded run was resumed under another strategy, whose files name none)."""
        if self.strategy.is_main and (self.strategy.writes_shards or (self.cfg.run_dir / sharded_checkpoint.SHARDS).is_dir()):
            self.writer.wait()
            sharded_checkpoint.collect(self.cfg.run_dir)

