"""Run by tests/test_trainlaunch.py under torchrun (2 gloo ranks): phalanx's GlobalBatchNorm
(``--sync-bn`` on CPU workers) against torch's BatchNorm on the two ranks' rows together, in
float64, over two training steps and an evaluation. Each rank saves what it found to OUT/rank<r>.pt."""

import sys

import torch
import torch.distributed as dist

from phalanx.distributed.sync_norm import GlobalBatchNorm, convert, padding_rows

out = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
ROWS = (5, 3)  # unequal shares
# name: (layer, one rank's sample shape)
CASES = {
    "2d": (lambda: torch.nn.BatchNorm2d(4, momentum=0.3), (4, 3, 3)),
    "1d cumulative": (lambda: torch.nn.BatchNorm1d(6, momentum=None), (6,)),
    "1d sequence, no affine": (lambda: torch.nn.BatchNorm1d(4, affine=False), (4, 5)),
}


def compare(name: str, make, shape: tuple, padding: bool) -> dict:
    """Two training steps of our layer on this rank's rows against torch's on every counted row
    (rank 1's rows a padding sample's when ``padding``), then one step in eval mode."""
    torch.manual_seed(0)
    reference = make().double()
    if reference.affine:
        with torch.no_grad():
            reference.weight.uniform_(0.5, 1.5)
            reference.bias.uniform_(-0.5, 0.5)
    ours = convert(torch.nn.Sequential(make().double()))
    ours.load_state_dict({f"0.{k}": v for k, v in reference.state_dict().items()})
    counted = [0] if padding else [0, 1]
    worst = {"outputs": 0.0, "input_grads": 0.0, "affine_grads": 0.0, "running": 0.0, "padding_outputs": 0.0}
    for _ in range(2):
        inputs = [torch.randn(n, *shape, dtype=torch.float64) * 2 + 1 for n in ROWS]
        weights = [torch.randn(n, *shape, dtype=torch.float64) for n in ROWS]  # each output's weight in the loss
        x_all = [x.clone().requires_grad_() for x in inputs]
        y_ref = reference(torch.cat([x_all[r] for r in counted]))
        (y_ref * torch.cat([weights[r] for r in counted])).sum().backward()
        x = inputs[rank].clone().requires_grad_()
        with padding_rows(padding and rank == 1):
            y = ours(x)
        ((y * weights[rank]).sum() * (0.0 if padding and rank == 1 else 1.0)).backward()
        if rank in counted:
            start = sum(ROWS[:rank])
            worst["outputs"] = max(worst["outputs"], (y - y_ref[start : start + ROWS[rank]]).abs().max().item())
            worst["input_grads"] = max(worst["input_grads"], (x.grad - x_all[rank].grad).abs().max().item())
        else:  # the padding rank normalises by rank 0's rows' statistics
            dims = [0, *range(2, x.dim())]
            mean, var = inputs[0].mean(dims), inputs[0].var(dims, unbiased=False)
            view = [1, -1] + [1] * (x.dim() - 2)
            expected = (inputs[1] - mean.view(view)) / (var.view(view) + reference.eps).sqrt()
            if reference.affine:
                expected = expected * reference.weight.view(view) + reference.bias.view(view)
            worst["padding_outputs"] = (y - expected).abs().max().item()
        if reference.affine:
            grads = torch.cat([ours[0].weight.grad, ours[0].bias.grad])
            dist.all_reduce(grads)  # DDP would average them; their sum is the whole batch's gradient
            expected_grads = torch.cat([reference.weight.grad, reference.bias.grad])
            worst["affine_grads"] = max(worst["affine_grads"], (grads - expected_grads).abs().max().item())
            for module in (ours[0], reference):
                module.weight.grad = module.bias.grad = None
    worst["running"] = max(
        (ours[0].running_mean - reference.running_mean).abs().max().item(),
        (ours[0].running_var - reference.running_var).abs().max().item(),
    )
    ours.eval()
    reference.eval()
    probe = torch.randn(3, *shape, dtype=torch.float64)
    worst["eval"] = (ours(probe) - reference(probe)).abs().max().item()  # the running statistics, no collective
    return {
        "type": type(ours[0]).__name__,
        "is_global": isinstance(ours[0], GlobalBatchNorm),
        "still_torchs": isinstance(ours[0], type(reference)),
        "tracked": int(ours[0].num_batches_tracked),
        "moved": (ours[0].running_var - 1).abs().max().item(),
        **worst,
    }


def bf16_inputs() -> dict:
    """bf16 activations (as under --precision bf16): the statistics are summed in float32 (in bf16 a
    mean of 5 would keep about 3 digits), the outputs come back in bf16."""
    torch.manual_seed(1)
    inputs = [(torch.randn(n, 4, 3, 3) * 3 + 5).to(torch.bfloat16) for n in ROWS]
    layer = convert(torch.nn.Sequential(torch.nn.BatchNorm2d(4, momentum=1.0)))  # running = this batch's
    y = layer(inputs[rank])
    seen = torch.cat(inputs).double()
    mean, var = seen.mean([0, 2, 3]), seen.var([0, 2, 3])
    return {
        "dtype": str(y.dtype),
        "running": max(
            (layer[0].running_mean.double() - mean).abs().max().item(),
            (layer[0].running_var.double() - var).abs().max().item(),
        ),
    }


def rank0_buffers() -> dict:
    """Without --sync-bn phalanx's DDP gives every rank rank 0's buffers after each step
    (phalanx.distributed.rank_buffers): a BatchNorm's statistics that each rank moved by its own rows, a bool
    mask, an empty buffer; the end-of-run comparison sees them differ before and agree after."""
    from phalanx.distributed.rank_buffers import broadcast_from_rank0, max_difference_from_rank0

    torch.manual_seed(10 + rank)
    net = torch.nn.Sequential(torch.nn.BatchNorm1d(3))
    net.register_buffer("mask", torch.rand(8) > 0.5)
    net.register_buffer("nothing", torch.zeros(0))
    net(torch.randn(6, 3, dtype=torch.float32))  # train mode: each rank's own running statistics
    before = max_difference_from_rank0(net, torch.device("cpu"))
    broadcast_from_rank0([net])
    return {
        "before": before,
        "after": max_difference_from_rank0(net, torch.device("cpu")),
        "mask": net.mask.clone(),
        "mean": net[0].running_mean.clone(),
        "tracked": int(net[0].num_batches_tracked),
    }


found = {
    f"{name}, padding={padding}": compare(name, make, shape, padding)
    for name, (make, shape) in CASES.items()
    for padding in (False, True)
}
found["bf16"] = bf16_inputs()
found["buffers"] = rank0_buffers()
torch.save(found, f"{out}/rank{rank}.pt")
dist.destroy_process_group()
