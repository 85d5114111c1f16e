"""DeepLIIF 1.2.7 itself, the reference of ``--task deepliif``: its network and model modules,
loaded from the files ``scripts/setup.sh --test`` puts in ``.venv/deepliif-1.2.7`` (installed
without its dependencies: its pins want another torch).

Only ``deepliif/models/networks.py``, ``att_unet.py``, ``base_model.py`` and ``DeepLIIF_model.py``
run, unchanged. What they import beyond torch and torchvision is stood in for here, and never
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
        util.__path__ = []
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
