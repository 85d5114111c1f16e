"""Run under torchrun (2 gloo ranks): ``--strategy fsdp`` wraps a torchvision ResNet-18 and
pix2pix's U-Net generator and PatchGAN (translate's networks), takes one Adam step each, and writes
$OUT/rank<R>.pt: how many weights and optimizer-state values this rank holds of each network, of
how many, and (rank 0) the state gathered whole for a checkpoint, with the networks' weights as
they were loaded back from it into fresh sharded networks; and the ResNet's BatchNorm statistics
before and inside ``whole_networks`` (validation); and whether a block's weights are still gathered
after its forward, with and without --no-reshard-after-forward; and under --precision bf16, the
dtypes a block computes in and keeps, its averaged gradients, and the exact mean of the ranks' own; and the
device type of the mesh each weight is sharded on, with the machine's accelerator said to be CUDA."""

import copy
import os
import sys

import torch
import torch.distributed as dist
import torchvision
from torch.distributed.tensor import DTensor

from phalanx.config import RunConfig
from phalanx.distributed.devices import placement
from phalanx.distributed.strategies import make_strategy
from phalanx.tasks.translate.nets import patch_discriminator, unet


def networks():
    torch.manual_seed(0)
    return {
        "resnet18": torchvision.models.resnet18(num_classes=10),
        "G": unet(3, 3, 5, 8, "instance", False),
        "D": patch_discriminator(6, 8, 3, "instance"),
    }


strategy = make_strategy(RunConfig.flat(strategy="fsdp"), placement())
rank = dist.get_rank()
# fully_shard's default mesh is the machine's accelerator's: while wrapping, the accelerator is said to
# be CUDA, as on a GPU machine, so these CPU workers show that the strategy's own mesh is the one used.
accelerator = torch._C._get_accelerator
torch._C._get_accelerator = lambda: torch.device("cuda")
try:
    models = {name: strategy.wrap(model) for name, model in networks().items()}
finally:
    torch._C._get_accelerator = accelerator
found = {"mesh_devices": {p.device_mesh.device_type for model in models.values() for p in model.parameters()}}
for name, model in models.items():
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(2, 6 if name == "D" else 3, 32, 32, generator=torch.Generator().manual_seed(rank))
    model(x).float().mean().backward()
    optimizer.step()
    state = optimizer.state_dict()
    found[name] = {
        "weights": sum(p.to_local().numel() for p in model.parameters()),
        "parameters": [key for key, _ in model.named_parameters()],
        "total": sum(p.numel() for p in model.parameters()),
        "optimizer": sum(v.to_local().numel() for s in state["state"].values() for k, v in s.items() if k != "step"),
        "whole": strategy.full_state({"model": model.state_dict(), "optimizer": state}),
    }
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
# --no-reshard-after-forward: a block's weights stay gathered from its forward until its backward
found["gathered_after_forward"] = {}
for reshard in (True, False):
    strategy.reshard_after_forward = reshard
    model = strategy.wrap(networks()["resnet18"])
    model(torch.randn(2, 3, 32, 32))
    found["gathered_after_forward"][reshard] = not isinstance(model.layer1[0].conv1.weight, DTensor)
strategy.reshard_after_forward = True

# --precision bf16: a block gathered in bfloat16 for its forward, its gradients averaged in float32:
# equal to the exact mean of each rank's bfloat16 gradient of the plain network
strategy.gathered_dtype = torch.bfloat16
torch.manual_seed(0)
plain = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))
mixed = strategy.wrap(copy.deepcopy(plain))
seen = []
mixed[0].register_forward_pre_hook(lambda module, inputs: seen.append(module.weight.dtype))  # after FSDP's gather
mixed[0].register_forward_hook(lambda module, inputs, output: seen.append(output.dtype))
x = torch.randn(4, 16, generator=torch.Generator().manual_seed(rank))
mixed(x).float().square().mean().backward()
local = copy.deepcopy(plain).bfloat16()
local(x.bfloat16()).float().square().mean().backward()
each = [None, None]
dist.all_gather_object(each, {name: p.grad.float() for name, p in local.named_parameters()})
means = {name: (each[0][name] + each[1][name]) / 2 for name in each[0]}  # exact in float32
found["mixed"] = {
    "gathered": tuple(seen),
    "kept": {p.dtype for p in mixed.parameters()},
    "grads": {name: p.grad.full_tensor() for name, p in mixed.named_parameters()},
    "means": means,
}
torch.save(found, os.path.join(sys.argv[1], f"rank{rank}.pt"))
dist.destroy_process_group()
