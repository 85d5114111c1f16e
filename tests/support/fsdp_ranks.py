"""Run under torchrun (2 gloo ranks): ``--strategy fsdp`` wraps a torchvision ResNet-18 and
pix2pix's U-Net generator and PatchGAN (translate's networks), takes one Adam step each, and writes
$OUT/rank<R>.pt: how many weights and optimizer-state values this rank holds of each network, of
how many, and (rank 0) the state gathered whole for a checkpoint, with the networks' weights as
they were loaded back from it into fresh sharded networks; and the ResNet's BatchNorm statistics
before and inside ``whole_networks`` (validation)."""

import os
import sys

import torch
import torch.distributed as dist
import torchvision

from phalanx.config import RunConfig
from phalanx.devices import placement
from phalanx.strategies import make_strategy
from phalanx.tasks.translate_nets import patch_discriminator, unet


def networks():
    torch.manual_seed(0)
    return {"resnet18": torchvision.models.resnet18(num_classes=10), "G": unet(3, 3, 5, 8, "instance", False),
            "D": patch_discriminator(6, 8, 3, "instance")}


strategy = make_strategy(RunConfig.flat(strategy="fsdp"), placement())
rank = dist.get_rank()
models = {name: strategy.wrap(model) for name, model in networks().items()}
found = {}
for name, model in models.items():
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(2, 6 if name == "D" else 3, 32, 32, generator=torch.Generator().manual_seed(rank))
    model(x).float().mean().backward()
    optimizer.step()
    state = optimizer.state_dict()
    found[name] = {"weights": sum(p.to_local().numel() for p in model.parameters()),
                   "parameters": [key for key, _ in model.named_parameters()],
                   "total": sum(p.numel() for p in model.parameters()),
                   "optimizer": sum(v.to_local().numel() for s in state["state"].values()
                                    for k, v in s.items() if k != "step"),
                   "whole": strategy.full_state({"model": model.state_dict(), "optimizer": state})}
    if name == "resnet18":  # BatchNorm's statistics of each rank's own batch, then rank 0's in validation
        found[name]["statistics"] = [model.bn1.running_mean.clone()]
        with strategy.whole_networks([model]):
            found[name]["statistics"].append(model.bn1.running_mean.clone())
    again = networks()[name]
    again = strategy.wrap(again)
    saved = found[name]["whole"]["model"] if rank == 0 else None
    shared = [saved]
    dist.broadcast_object_list(shared, src=0)
    again.load_state_dict(strategy.local_model_state(shared[0], again))
    found[name]["reloaded"] = strategy.full_state(again.state_dict())
torch.save(found, os.path.join(sys.argv[1], f"rank{rank}.pt"))
dist.destroy_process_group()
