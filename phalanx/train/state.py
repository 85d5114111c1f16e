"""The named stateful parts of a training run, saved and restored as one (Lightning Fabric's
``save_checkpoint(path, state)``, torchtitan's ``CheckpointManager(states=...)``): the networks,
their optimizers and gradient scalers, the moving averages of the weights, and the task's own state
(a momentum teacher, a queue), the best metric so far and the epoch's loss sums. The position in
training (epoch, samples, steps) is the trainer's, beside these."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..checkpoint import sharded as sharded_checkpoint
from ..distributed.strategy import Strategy
from ..models.recipe import ModelEma
from ..tasks.base import Task
from .best import Best
from .losses import TrainLosses
from .optim import keep_implementation


def saved_network(state: dict[str, Any], name: str) -> dict[str, torch.Tensor] | None:
    """A network's weights in a checkpoint: under ``models``, or (checkpoints before BYOL's teacher
    became a network, format 3) in the task's own state under the network's name."""
    found = state["models"].get(name)
    return found if found is not None else (state.get("task_state") or {}).get(name)


def network_weights(state: dict[str, Any], name: str, ema: bool = False) -> dict[str, torch.Tensor] | None:
    """The weights ``evaluate``/``predict``/``export`` load into a network: its moving average with
    ``ema`` where the checkpoint has one, else the trained weights."""
    averaged = state.get("ema") or {}
    return averaged[name] if ema and name in averaged else saved_network(state, name)


class NetworkMismatch(Exception):
    """A checkpoint's weights for ``name`` that do not fit the network built (``error``: torch's)."""

    def __init__(self, name: str, error: RuntimeError):
        super().__init__(name, error)
        self.name, self.error = name, error


def load_for_inference(state: dict[str, Any], models: dict[str, nn.Module], task: Task, ema: bool) -> None:
    """The parts inference needs, from the same checkpoint entries a resume reads: each network
    (``KeyError`` naming one the checkpoint lacks; ``NetworkMismatch`` where one does not fit) and the
    task's own state. Optimizers, scalers, best and the loss sums are training's alone."""
    for name, model in models.items():
        weights = network_weights(state, name, ema)
        if weights is None:
            raise KeyError(name)
        try:
            model.load_state_dict(weights)
        except RuntimeError as exc:
            raise NetworkMismatch(name, exc) from None
        model.eval()
    task.load_state_dict(state.get("task_state") or {})


class RunState:
    def __init__(
        self,
        bare_models: Callable[[], dict[str, nn.Module]],
        optimizers: dict[str, torch.optim.Optimizer],
        scalers: dict[str, torch.amp.GradScaler],
        ema: dict[str, ModelEma],
        task: Task,
        best: Best,
        losses: TrainLosses,
        strategy: Strategy,
    ):
        self.bare_models, self.optimizers, self.scalers, self.ema, self.task = (
            bare_models,
            optimizers,
            scalers,
            ema,
            task,
        )
        self.best, self.losses, self.strategy = best, losses, strategy

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint file holds: the networks and optimizer states whole (``Strategy.full_state``:
        under FSDP every rank takes part, and rank 0 alone gets the tensors), or none of them where
        each rank writes its shard of them apart (``phalanx.checkpoint.sharded``)."""
        rest = {
            "scalers": {name: scaler.state_dict() for name, scaler in self.scalers.items()},
            "ema": {name: ema.module.state_dict() for name, ema in self.ema.items()} or None,
            "task_state": self.task.state_dict(),
            "best": self.best.state(),
            "epoch_sums": self.losses.state(),
        }
        if self.strategy.writes_shards:
            return rest
        return self.strategy.full_state(
            {
                "models": {name: model.state_dict() for name, model in self.bare_models().items()},
                "optimizers": {name: opt.state_dict() for name, opt in self.optimizers.items()},
                **rest,
            }
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        bare = self.bare_models()
        if state.get("sharded"):  # each rank reads its part, whatever the world size and strategy that wrote it
            sharded_checkpoint.restore(Path(state["sharded"]), bare, self.optimizers)
        else:
            for name, model in bare.items():
                weights = saved_network(state, name)
                assert weights is not None, f"the checkpoint has no weights of {name}"
                model.load_state_dict(self.strategy.local_model_state(weights, model))
            for name, optimizer in self.optimizers.items():
                optimizer.load_state_dict(self.strategy.local_optimizer_state(state["optimizers"][name], optimizer))
        for optimizer in self.optimizers.values():
            keep_implementation(optimizer)
        for name, scaler in self.scalers.items():
            if state.get("scalers", {}).get(name):
                scaler.load_state_dict(state["scalers"][name])
        saved_ema = state.get("ema") or {}
        for name, ema in self.ema.items():  # a checkpoint from before --ema-decay starts the average at its weights
            ema.module.load_state_dict(saved_ema.get(name) or bare[name].state_dict())
        self.task.load_state_dict(state.get("task_state") or {})
        self.best.restore(state.get("best") or {})
        self.losses.restore(state["epoch_sums"])
