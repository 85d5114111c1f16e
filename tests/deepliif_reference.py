"""DeepLIIF 1.2.7 itself, the reference of ``--task deepliif``: its network and model modules,
loaded from the files ``scripts/setup.sh --test`` puts in ``.venv/deepliif-1.2.7`` (installed
without its dependencies: its pins want another torch).

Only ``deepliif/models/networks.py``, ``att_unet.py``, ``base_model.py``, the models' modules
(``DeepLIIF_model.py``, ``DeepLIIFExt_model.py``, ``SDG_model.py``, ``CycleGAN_model.py``) and
``util/image_pool.py`` run, unchanged. What they import beyond torch and torchvision is stood in for here, and never
used by a training step: ``deepliif.util``'s two BatchNorm switches (evaluation only) and
``deepliif.util.util``'s ``init_input_and_mod_id`` (a new training: segmentation id "S", input id
"0", as DeepLIIF's own function returns for ``deepliif train`` with its defaults). VGG19 is
torchvision's, with the weights the test gives (ImageNet's are not on this machine).
"""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(sys.prefix) / "deepliif-1.2.7"


def modules() -> SimpleNamespace:
    """DeepLIIF's ``networks`` and ``DeepLIIF_model`` modules (loaded once per process)."""
    if not (ROOT / "deepliif" / "models" / "DeepLIIF_model.py").is_file():
        raise RuntimeError(f"DeepLIIF 1.2.7 is not in {ROOT}: run scripts/setup.sh --test")
    if "deepliif.models.DeepLIIF_model" not in sys.modules:
        package = types.ModuleType("deepliif")
        package.__path__ = [str(ROOT / "deepliif")]
        util = types.ModuleType("deepliif.util")
        util.__path__ = [str(ROOT / "deepliif" / "util")]  # (its image_pool, which CycleGAN imports, as it is)
        util.disable_batchnorm_tracking_stats = util.enable_batchnorm_tracking_stats = lambda *a, **k: None
        util.__all__ = []
        util_util = types.ModuleType("deepliif.util.util")
        util_util.init_input_and_mod_id = lambda opt, dir_model=None: ("S", "0")
        util_util.get_input_id = lambda dir_model: "0"
        util_util.mkdirs = lambda paths: None
        util.util = util_util
        models = types.ModuleType("deepliif.models")
        models.__path__ = [str(ROOT / "deepliif" / "models")]
        sys.modules.update(
            {"deepliif": package, "deepliif.util": util, "deepliif.util.util": util_util, "deepliif.models": models}
        )
    return SimpleNamespace(
        networks=importlib.import_module("deepliif.models.networks"),
        model=importlib.import_module("deepliif.models.DeepLIIF_model"),
        ext=importlib.import_module("deepliif.models.DeepLIIFExt_model"),
        sdg=importlib.import_module("deepliif.models.SDG_model"),
        cyclegan=importlib.import_module("deepliif.models.CycleGAN_model"),
        options=importlib.import_module("deepliif.options"),
    )


def postprocessing():
    """DeepLIIF's ``postprocessing`` module, its numba-compiled functions run as plain Python (a
    stand-in ``numba`` while it imports: ``jit`` leaves a function as it is, ``typed.List`` is a list).
    numba adds uint8 pixels in 64-bit integers; give it int64 images to do the same in Python."""
    modules()
    if "deepliif.postprocessing" not in sys.modules:
        numba = types.ModuleType("numba")
        numba.jit = lambda *args, **kwargs: lambda function: function
        numba.typed = SimpleNamespace(List=list)
        saved = sys.modules.get("numba")
        sys.modules["numba"] = numba
        try:
            importlib.import_module("deepliif.postprocessing")
        finally:
            if saved is None:
                del sys.modules["numba"]
            else:
                sys.modules["numba"] = saved
    return sys.modules["deepliif.postprocessing"]


def disable_batchnorm_tracking_stats(net):
    """DeepLIIF's own ``deepliif.util.disable_batchnorm_tracking_stats`` (what its inference and
    ``serialize`` do to BatchNorm), compiled from its source alone: its module imports Java bridges."""
    import ast

    source = (ROOT / "deepliif" / "util" / "__init__.py").read_text()
    function = next(
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef) and node.name == "disable_batchnorm_tracking_stats"
    )
    namespace = {"torch": torch}
    exec(compile(ast.Module([function], []), "deepliif/util/__init__.py", "exec"), namespace)
    return namespace["disable_batchnorm_tracking_stats"](net)


def options(**given) -> SimpleNamespace:
    """``deepliif train``'s options as its ``Options`` holds them, with DeepLIIF's defaults, for
    ``DeepLIIFModel`` on the CPU."""
    opt = dict(
        gpu_ids=[],
        is_train=True,
        checkpoints_dir=".",
        name="reference",
        phase="train",
        preprocess=None,
        remote_transfer_cmd=None,
        seg_gen=True,
        modalities_no=4,
        input_nc=3,
        output_nc=3,
        input_no=1,
        ngf=64,
        ndf=64,
        netG="resnet_9blocks",
        net_gs="unet_512",
        netD="n_layers",
        n_layers_D=4,
        norm="batch",
        no_dropout=False,
        init_type="normal",
        init_gain=0.02,
        padding="zero",
        upsample="convtranspose",
        gan_mode="vanilla",
        gan_mode_s="lsgan",
        lambda_L1=100.0,
        lambda_feat=100.0,
        optimizer="adam",
        lr_g=2e-4,
        lr_d=2e-4,
        beta1=0.5,
        seg_weights=[0.25, 0.15, 0.25, 0.1, 0.25],
        loss_G_weights=[0.2] * 5,
        loss_D_weights=[0.2] * 5,
        continue_train=False,
        modalities_names=[],
    )
    opt.update(given)
    return SimpleNamespace(**opt)


def vgg_with(features: torch.nn.Sequential):
    """Make DeepLIIF's ``Vgg19`` take torchvision's VGG19 with these features' weights (its
    ``models.vgg19(pretrained=True)`` would download ImageNet's)."""
    networks = modules().networks
    from torchvision.models import vgg19

    def vgg19_given(pretrained=False, **kwargs):
        net = vgg19()
        net.features.load_state_dict(features.state_dict(), strict=False)
        return net

    networks.models = SimpleNamespace(vgg19=vgg19_given)


def model_directory(out: Path, ngf: int = 4, seed: int = 0) -> None:
    """A DeepLIIF model directory as ``deepliif train`` and ``serialize`` leave one, made with
    DeepLIIF's own ``define_G``, ``disable_batchnorm_tracking_stats`` and ``format_options``: four
    ``resnet_9blocks`` modality networks and five ``unet_512`` segmentation networks, each as
    ``latest_net_G1.pth``.. (training's) and traced to ``G1.pt``.., ``GS0.pt``.. (serialize's,
    what ``deepliif test`` runs), and today's ``train_opt.txt``. BatchNorm's parameters and
    statistics are perturbed (freshly made they are 1 and 0, where a wrong statistics rule would
    not show), and each segmentation network's last layer is scaled so that it draws red and blue
    blobs on black: cells to count, as a trained network draws them."""
    networks = modules().networks
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    nets = {
        f"G{k}": networks.define_G(3, 3, ngf, "resnet_9blocks", "batch", True, "normal", 0.02, [], "zero")
        for k in range(1, 5)
    }
    nets.update(
        {f"GS{k}": networks.define_G(3, 3, ngf, "unet_512", "batch", True, "normal", 0.02, []) for k in range(5)}
    )
    noise = torch.Generator().manual_seed(seed + 1)
    for net in nets.values():
        for module in net.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.weight.data = 1 + 0.5 * torch.randn(module.weight.shape, generator=noise)
                module.bias.data = 0.3 * torch.randn(module.bias.shape, generator=noise)
                module.running_mean.data = 0.1 * torch.randn(module.running_mean.shape, generator=noise)
                module.running_var.data = 1 + 0.2 * torch.rand(module.running_var.shape, generator=noise)
    for k in range(5):
        last = nets[f"GS{k}"].model.model[3]  # the outermost ConvTranspose2d, before its Tanh
        last.weight.data *= 8
        last.bias.data = torch.tensor([-0.9, -2.0, -0.9])
    for name, net in nets.items():
        torch.save(net.state_dict(), out / f"latest_net_{name}.pth")
        served = disable_batchnorm_tracking_stats(net.eval())
        torch.jit.trace(served, torch.zeros(1, 3, 512, 512)).save(str(out / f"{name}.pt"))
    opt = options(
        ngf=ngf,
        model="DeepLIIF",
        name=out.name,
        checkpoints_dir=str(out.parent),
        seg_no=1,
        scale_size=512,
        net_g=["resnet_9blocks"] * 4,
        net_gs=["unet_512"] * 5,
        background_colors=[(200, 200, 190), (20, 20, 30), (5, 5, 5), (12, 12, 12)],
        load_iter=0,  # deepliif train writes both
        epoch="latest",
    )
    (out / "train_opt.txt").write_text(modules().options.format_options(opt) + "\n")


def released_layout(model_dir: Path, out: Path, ngf: int = 4) -> None:
    """``model_dir``'s TorchScript networks laid out as DeepLIIF's released model is: ``G1.pt``..
    ``G4.pt`` and the segmentation networks as ``G51.pt``..``G55.pt``, with a ``train_opt.txt`` of
    an older version (``targets_no`` 5; no ``modalities_names``, ``seg_weights``, ``scale_size``,
    ``net_gs``: DeepLIIF's test mode supplies them)."""
    import shutil

    out.mkdir(parents=True, exist_ok=True)
    for k in range(1, 5):
        shutil.copyfile(model_dir / f"G{k}.pt", out / f"G{k}.pt")
    for k in range(5):
        shutil.copyfile(model_dir / f"GS{k}.pt", out / f"G5{k + 1}.pt")
    opt = options(ngf=ngf, model="DeepLIIF", name=out.name, checkpoints_dir=str(out.parent), targets_no=5)
    for key in ("modalities_names", "seg_weights", "modalities_no", "input_no", "net_gs"):
        delattr(opt, key)
    (out / "train_opt.txt").write_text(modules().options.format_options(opt) + "\n")
