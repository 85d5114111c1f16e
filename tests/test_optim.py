"""The optimizers phalanx builds: torch's fused kernels, stepping exactly as torch's own per-parameter loop."""

import pytest
import torch

from phalanx.config.sections import OptimOptions
from phalanx.train.optim import build_optimizer, keep_implementation, step


def stepped(kind: str, fused: bool, grads: list[torch.Tensor]) -> list[torch.Tensor]:
    """A channels-last conv and a linear layer after three steps of the given gradients: the conv
    weight's gradient in the other layout (contiguous) at every step, as autograd sometimes gives."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Flatten(), torch.nn.Linear(8, 4)).double()
    net[0].weight.data = net[0].weight.data.contiguous(memory_format=torch.channels_last)
    options = OptimOptions(optimizer=kind, weight_decay=1e-3)
    if fused:
        optimizer = build_optimizer(options, net.parameters(), 0.1)
    else:  # torch's reference: the for-loop implementation
        cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[kind]
        extra = {"momentum": options.momentum} if kind == "sgd" else {"betas": options.betas}
        optimizer = cls(net.parameters(), lr=0.1, weight_decay=1e-3, foreach=False, **extra)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    for k in range(3):
        for param, grad in zip(net.parameters(), grads):
            param.grad = grad * (k + 1)  # contiguous: a layout other than the conv weight's
        step(optimizer, scaler)
    assert optimizer.defaults.get("fused") is (True if fused else None)
    return [p.detach() for p in net.parameters()]


@pytest.mark.parametrize("kind", ["sgd", "adam", "adamw"])
def test_fused_steps_equal_torchs_loop_even_for_a_gradient_in_another_layout(kind):
    shapes = [(8, 3, 3, 3), (8,), (4, 8), (4,)]
    grads = [
        torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(i))
        for i, shape in enumerate(shapes)
    ]
    fused, loop = stepped(kind, True, grads), stepped(kind, False, grads)
    for ours, reference in zip(
        fused, loop
    ):  # float64: 6e-17 apart here (Adam rounds in another order); 1e-12: a wide margin
        torch.testing.assert_close(ours, reference, rtol=0, atol=1e-12)  # (a wrong layout: off by 0.4)
    assert fused[0].is_contiguous(memory_format=torch.channels_last)


def test_parameters_without_fused_kernels_get_torchs_default():
    param = torch.nn.Parameter(torch.zeros(3, dtype=torch.complex64))  # fused here: real floating types only
    optimizer = build_optimizer(OptimOptions(optimizer="adam"), [param], 0.1)
    assert not optimizer.defaults.get("fused")
    param.grad = torch.ones(3, dtype=torch.complex64)
    step(optimizer, torch.amp.GradScaler("cpu", enabled=False))
    assert torch.allclose(param.detach().real, torch.full((3,), -0.1))


def test_fused_sgd_takes_a_parameter_whose_first_gradient_comes_late():
    # Some parameters with a momentum buffer, others none yet (DINO's last layer is frozen at first):
    # torch 2.14's fused SGD fails on that mix; phalanx's step gives the late one a zero buffer.
    def run(fused: bool) -> list[torch.Tensor]:
        params = [torch.nn.Parameter(torch.ones(4, dtype=torch.float64) * (i + 1)) for i in range(2)]
        optimizer = (
            build_optimizer(OptimOptions(optimizer="sgd"), params, 0.1)
            if fused
            else torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=5e-4, foreach=False)
        )
        for k in range(4):
            params[0].grad = torch.full((4,), 0.5 + k, dtype=torch.float64)
            params[1].grad = torch.full((4,), 2.0 - k, dtype=torch.float64) if k >= 2 else None
            step(optimizer, torch.amp.GradScaler("cpu", enabled=False))
        return [p.detach() for p in params]

    for ours, reference in zip(run(True), run(False)):
        torch.testing.assert_close(ours, reference, rtol=0, atol=1e-12)


@pytest.mark.parametrize("saved_fused", [True, False])
def test_a_resumed_optimizer_keeps_its_own_implementation(saved_fused):
    # torch's load_state_dict restores the saved groups whole, flags included: a DDP checkpoint's fused
    # flag reached FSDP's shards, which have no fused kernels (tests/test_fsdp.py's DDP -> FSDP resume).
    def optimizer(fused: bool) -> torch.optim.Optimizer:
        param = torch.nn.Parameter(torch.ones(3))
        made = build_optimizer(OptimOptions(optimizer="adam"), [param], 0.1)
        if not fused:
            made = torch.optim.Adam([param], lr=0.1)
        param.grad = torch.ones(3)
        step(made, torch.amp.GradScaler("cpu", enabled=False))
        return made

    loaded = optimizer(not saved_fused)
    loaded.load_state_dict(optimizer(saved_fused).state_dict())
    assert bool(loaded.param_groups[0]["fused"]) is saved_fused  # what torch does
    keep_implementation(loaded)
    assert bool(loaded.param_groups[0]["fused"]) is (not saved_fused)
    step(loaded, torch.amp.GradScaler("cpu", enabled=False))  # and it steps


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_a_resume_that_switches_channels_last_steps_as_torchs_loop(kind):
    # --channels-last may change at a resume: the loaded momentum (or moments) keep the checkpoint's
    # layout; a fused step would read them as the parameter's (off by 0.3 for SGD, measured).
    def resumed(fused: bool) -> torch.Tensor:
        weight = torch.nn.Parameter(
            torch.randn(8, 3, 3, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        )
        options = OptimOptions(optimizer=kind)
        first = (
            build_optimizer(options, [weight], 0.1)
            if fused
            else torch.optim.SGD([weight], lr=0.1, momentum=0.9, weight_decay=5e-4, foreach=False)
            if kind == "sgd"
            else torch.optim.Adam([weight], lr=0.1, weight_decay=5e-4, foreach=False)
        )
        weight.grad = torch.linspace(-1, 1, weight.numel(), dtype=torch.float64).view(weight.shape)
        step(first, torch.amp.GradScaler("cpu", enabled=False))
        saved = first.state_dict()
        moved = torch.nn.Parameter(weight.detach().contiguous(memory_format=torch.channels_last))
        second = (
            build_optimizer(options, [moved], 0.1)
            if fused
            else type(first)(
                [moved],
                **{k: v for k, v in first.defaults.items() if k in ("lr", "momentum", "weight_decay")},
                foreach=False,
            )
        )
        second.load_state_dict(saved)
        keep_implementation(second)
        moved.grad = (
            torch.linspace(1, -1, moved.numel(), dtype=torch.float64)
            .view(moved.shape)
            .contiguous(memory_format=torch.channels_last)
        )
        step(second, torch.amp.GradScaler("cpu", enabled=False))
        return moved.detach()

    torch.testing.assert_close(resumed(True), resumed(False), rtol=0, atol=1e-12)


def test_gradients_are_clipped_unscaled_under_a_gradscaler():
    # fp16's GradScaler multiplies the loss by 2^16: --clip-grad bounds the true gradient, so the
    # scaler unscales first (a bound on the scaled gradient would clip every step to nothing).
    from phalanx.config import RunConfig
    from phalanx.train.optim import clip_gradients

    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(5, dtype=torch.float64))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    start = weight.detach().clone()
    scaler.scale((weight * torch.arange(5.0, dtype=torch.float64)).sum() * 10).backward()  # gradient norm 54.8
    clip_gradients(optimizer, scaler, RunConfig.flat(clip_grad=2.0).optim)
    assert weight.grad.norm().item() == pytest.approx(2.0)
    scaler.step(optimizer)  # takes the unscaled, clipped gradient once
    expected = start - 0.1 * 2.0 * torch.arange(5.0, dtype=torch.float64) / torch.arange(5.0).norm().item()
    assert torch.allclose(weight.detach(), expected, atol=1e-12)
