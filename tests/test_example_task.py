"""The worked example of your own task (examples/tasks/adversarial_autoencoder.py, docs/your-own-task.md)
does what the page says a task can do: train, then predict and export from its checkpoint alone."""

from __future__ import annotations

import json

import torch

AAE = "adversarial_autoencoder:AdversarialAutoencoder"


def digits_as_pngs(folder, count: int) -> list:
    """``count`` of the built-in digits as grey PNGs of 16x16 (not the 8x8 the network takes), in
    two subfolders, so that predict resizes them and keeps the folders apart."""
    from phalanx.data import load_digits
    from phalanx.records.pictures import png

    images, _ = load_digits()
    paths = []
    for index in range(count):
        big = torch.nn.functional.interpolate(images[index][None].float(), size=(16, 16), mode="nearest")[0]
        path = folder / ("even" if index % 2 == 0 else "odd") / f"digit{index}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(png(big, min_side=0))
        paths.append(path)
    return paths


def test_the_example_task_trains_predicts_and_exports(tmp_path, phalanx):
    from PIL import Image

    trained = phalanx(
        "train", "--task", AAE, "--epochs", 1, "--checkpoints-dir", tmp_path / "runs", "--name", "aae", "--no-progress"
    )
    assert trained.code == 0, trained.err
    inputs = digits_as_pngs(tmp_path / "digits", 5)
    (tmp_path / "out").mkdir()
    predicted = phalanx(
        "predict",
        "--checkpoint",
        tmp_path / "runs" / "aae",
        tmp_path / "digits",
        "--output",
        tmp_path / "out" / "reconstructed",
        "--no-progress",
    )
    assert predicted.code == 0, predicted.err
    assert "5 image(s) predicted, 0 skipped" in predicted.out, predicted.out
    written = sorted(p.relative_to(tmp_path / "out" / "reconstructed") for p in (tmp_path / "out").rglob("*.png"))
    assert [str(p) for p in written] == sorted(str(p.relative_to(tmp_path / "digits")) for p in inputs)
    for path in written:
        with Image.open(tmp_path / "out" / "reconstructed" / path) as picture:
            assert (picture.mode, picture.size) == ("L", (8, 8))  # the generator's 8x8 reconstruction

    exported = phalanx("export", "--checkpoint", tmp_path / "runs" / "aae", "--output", tmp_path / "aae.ts")
    assert exported.code == 0, exported.err
    meta = json.loads((tmp_path / "aae.ts.json").read_text())
    assert (meta["channels"], meta["image_size"], meta["mean"], meta["std"]) == (1, 8, [0.5], [0.5])
    generator = torch.jit.load(str(tmp_path / "aae.ts"))
    out = generator(torch.zeros(3, 1, 8, 8))
    assert out.shape == (3, 1, 8, 8) and bool(((out >= -1) & (out <= 1)).all())  # Tanh: the inputs' range


def test_the_example_predicts_what_its_generator_makes(tmp_path, phalanx):
    # The PNG is the generator's output for the prepared image, denormalised: not a copy of the input.
    from adversarial_autoencoder import generator, prepare  # examples/tasks, on the path by conftest
    from PIL import Image

    assert (
        phalanx(
            "train", "--task", AAE, "--epochs", 1, "--checkpoints-dir", tmp_path, "--name", "aae", "--no-progress"
        ).code
        == 0
    )
    [path] = digits_as_pngs(tmp_path / "digits", 1)
    assert (
        phalanx("predict", "--checkpoint", tmp_path / "aae", path, "--output", tmp_path / "out", "--no-progress").code
        == 0
    )
    checkpoint = torch.load(tmp_path / "aae" / "latest.pt", weights_only=True)
    network = generator(16)
    network.load_state_dict(checkpoint["model"])
    with Image.open(path) as picture:
        grey = torch.frombuffer(bytearray(picture.convert("L").tobytes()), dtype=torch.uint8).view(1, 16, 16)
    expected = ((network.eval()(prepare(grey)[None])[0] + 1) / 2).clamp(0, 1)
    with Image.open(tmp_path / "out" / "digit0.png") as picture:
        got = torch.frombuffer(bytearray(picture.tobytes()), dtype=torch.uint8).view(1, 8, 8).float() / 255
    assert (got - expected).abs().max() <= 1 / 255 + 1e-6
