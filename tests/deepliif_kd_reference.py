"""DeepLIIF 1.2.7's own ``DeepLIIFKDModel`` for two training steps, in its own process (its teacher
is loaded by DeepLIIF's ``get_opt``, ``init_nets`` and run by ``run_dask``, which need the whole
``deepliif`` package: imported unchanged, as ``deepliif_cli`` imports it).

``python tests/deepliif_kd_reference.py SPEC.pt``: SPEC holds the options, the samples (N, panels,
3, H, W), VGG19's features and where to write. The student's first networks are written with
``save_networks('latest')`` before the steps (phalanx starts from them: ``--weights``); after the
2 steps, every network's state and the last step's losses go to SPEC's ``out``. float64: the
student, the teacher (as loaded), the criteria."""

import sys
import types
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(sys.prefix) / "deepliif-1.2.7"
for name in ("bioformats", "javabridge", "bioformats.omexml"):
    sys.modules[name] = types.ModuleType(name)
sys.modules["bioformats"].omexml = sys.modules["bioformats.omexml"]
sys.path.insert(0, str(ROOT))


def main(spec_path: str) -> None:
    spec = torch.load(spec_path, weights_only=False)
    from deepliif.models import networks
    from deepliif.models.DeepLIIFKD_model import DeepLIIFKDModel
    from torchvision.models import vgg19

    features = spec["vgg"]

    def vgg19_given(pretrained=False, **kwargs):  # ImageNet's weights are not on this machine
        net = vgg19()
        net.features.load_state_dict(features.state_dict(), strict=False)
        return net

    networks.models = SimpleNamespace(vgg19=vgg19_given)
    torch.manual_seed(0)
    model = DeepLIIFKDModel(SimpleNamespace(**spec["opt"]))
    names = model.model_names
    for name in names:
        getattr(model, f"net{name}").double()
    for net in model.nets_teacher.values():
        net.double()
    for criterion in (model.criterionVGG, model.criterionGAN_BCE, model.criterionGAN_lsgan):
        criterion.double()
    Path(model.save_dir).mkdir(parents=True, exist_ok=True)
    model.save_networks("latest")
    samples = spec["samples"]
    for _ in range(2):
        model.set_input({"A": samples[:, 0], "B": [samples[:, k] for k in range(1, samples.shape[1])], "A_paths": []})
        model.optimize_parameters()
    torch.save(
        {
            "states": {name: getattr(model, f"net{name}").state_dict() for name in names},
            "losses": {  # every loss it computed (each an attribute loss_NAME), its VGG terms too
                name[len("loss_") :]: float(value)
                for name, value in vars(model).items()
                if name.startswith("loss_") and torch.is_tensor(value) and value.dim() == 0
            },
        },
        spec["out"],
    )


if __name__ == "__main__":
    main(sys.argv[1])
