"""The self-supervised views made a batch at a time (phalanx/tasks/selfsupervised/view_batch.py): each view equal to
torchvision's functional operations applied to its image one at a time with the same parameters,
the same in any batch, and drawn with the distributions of torchvision's transforms."""

from __future__ import annotations

import math

import pytest
import torch
from PIL import ImageFilter
from torchvision import transforms as T
from torchvision.transforms import functional as TF

from phalanx.data.sampling import derive_seed
from phalanx.tasks.selfsupervised import view_batch as vb
from phalanx.tasks.selfsupervised.views import ValidationViews, multi_crop, two_views


def torchvisions_view(image: torch.Tensor, row: torch.Tensor, recipe: vb.ViewRecipe) -> torch.Tensor:
    """The view of ``row``'s parameters, made by torchvision's functional operations on one image."""
    x = image.float() / 255 if image.dtype == torch.uint8 else image.float()
    x0, y0, x1, y1 = (int(v) for v in row[:4])
    x = TF.resized_crop(x, y0, x0, y1 - y0, x1 - x0, [recipe.size, recipe.size], antialias=True)
    if row[vb.FLIP]:
        x = TF.hflip(x)
    if row[vb.JITTER]:
        adjust = (TF.adjust_brightness, TF.adjust_contrast, TF.adjust_saturation, TF.adjust_hue)
        for step in row[vb.ORDER].long().tolist():
            if recipe.channels == 3 or step < 2:
                x = adjust[step](x, float(row[vb.BRIGHTNESS + step]))
    if row[vb.GRAY]:
        x = TF.rgb_to_grayscale(x, 3)
    if row[vb.BLUR]:
        x = TF.gaussian_blur(x, [recipe.kernel] * 2, [float(row[vb.SIGMA])] * 2)
    return TF.normalize(x, list(recipe.mean), list(recipe.std))


@pytest.mark.parametrize("channels,dtype", [(3, torch.uint8), (3, torch.float32), (1, torch.uint8)])
def test_every_view_of_a_batch_is_torchvisions_view_of_its_image(channels, dtype):
    # Images of several sizes and shapes in one batch, crops enlarged and shrunk, every step drawn
    # in some views (blur at p 0.5 with a 5-tap kernel).
    torch.manual_seed(0)
    recipe = vb.ViewRecipe(48, channels, (0.08, 1.0), True, 0.5, (0.4,) * channels, (0.3,) * channels)
    images = [torch.randint(0, 256, (channels, 30 + 9 * i % 50, 70 - 7 * i % 40), dtype=torch.uint8) for i in range(24)]
    images = [image if dtype == torch.uint8 else image.float() / 255 for image in images]
    owners = list(range(24)) * 3
    rows = torch.stack([recipe.draw(*images[owner].shape[-2:]) for owner in owners])
    for column in (vb.FLIP, vb.JITTER, vb.GRAY if channels == 3 else vb.JITTER, vb.BLUR):
        assert 0 < rows[:, column].sum() < len(rows), column  # some views take the step, some do not
    widths = rows[:, vb.X1] - rows[:, vb.X0]
    assert (widths < recipe.size).any() and (widths > recipe.size).any()  # enlarged and shrunk
    made = recipe.make(images, owners, rows)
    assert made.shape == (72, channels, 48, 48) and made.dtype == torch.float32
    for view, owner in enumerate(owners):
        expected = torchvisions_view(images[owner], rows[view], recipe)
        # float32 arithmetic in another order (a blur in two passes, a mean in float64): a few ulps
        # of values up to 1 / 0.3, 8e-6 at most measured
        assert (made[view] - expected).abs().max() < 1e-4, (view, rows[view])


def test_a_view_is_the_same_bits_in_any_batch():
    # What makes the views of a world size's batches those of another's: each view alone.
    torch.manual_seed(1)
    recipe = vb.ViewRecipe(64, 3, (0.08, 1.0), True, 0.5, (0.5,) * 3, (0.25,) * 3)
    images = [torch.randint(0, 256, (3, 96, 96), dtype=torch.uint8) for _ in range(16)]
    rows = torch.stack([recipe.draw(96, 96) for _ in images])
    together = recipe.make(images, list(range(16)), rows)
    for index in (0, 5, 15):
        alone = recipe.make([images[index]], [0], rows[index : index + 1])
        assert torch.equal(alone[0], together[index])
    half = recipe.make(images[8:], list(range(8)), rows[8:])
    assert torch.equal(half, together[8:])


def test_a_large_view_is_the_same_bits_alone_as_among_others_on_two_threads():
    # From 182 px up, a sum of one output is split among threads: a view's contrast mean, taken
    # alone or among others, must not be.
    torch.manual_seed(4)
    recipe = vb.ViewRecipe(192, 3, (0.5, 1.0), False, 0.0, (0.5,) * 3, (0.25,) * 3)
    images = [torch.randint(0, 256, (3, 200, 200), dtype=torch.uint8) for _ in range(6)]
    rows = torch.stack([recipe.draw(200, 200) for _ in images])
    rows[:, vb.JITTER], rows[:, vb.ORDER] = 1.0, torch.tensor([1.0, 0.0, 2.0, 3.0])  # contrast first, in every view
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        together = recipe.make(images, list(range(6)), rows)
        for index in range(6):
            assert torch.equal(recipe.make([images[index]], [0], rows[index : index + 1])[0], together[index]), index
    finally:
        torch.set_num_threads(threads)


def test_the_draws_have_torchvisions_distributions():
    torch.manual_seed(2)
    n = 4000
    recipe = vb.ViewRecipe(32, 3, (0.2, 1.0), True, 0.5, (0.5,) * 3, (0.5,) * 3)
    rows = torch.stack([recipe.draw(40, 60) for _ in range(n)])
    theirs = torch.tensor(
        [T.RandomResizedCrop.get_params(torch.zeros(3, 40, 60), [0.2, 1.0], [3 / 4, 4 / 3]) for _ in range(n)],
        dtype=torch.float64,
    )  # (top, left, height, width)
    width, height = rows[:, vb.X1] - rows[:, vb.X0], rows[:, vb.Y1] - rows[:, vb.Y0]
    assert rows[:, vb.X0].min() >= 0 and rows[:, vb.Y0].min() >= 0
    assert rows[:, vb.X1].max() <= 60 and rows[:, vb.Y1].max() <= 40
    # Means of the crop's area, aspect ratio and place against torchvision's sampler's: equal
    # within 6 standard errors of their difference (the spreads, measured here, not assumed)
    for ours, their in (
        (width * height, theirs[:, 2] * theirs[:, 3]),
        ((width / height).log(), (theirs[:, 3] / theirs[:, 2]).log()),
        (rows[:, vb.X0], theirs[:, 1]),
        (rows[:, vb.Y0], theirs[:, 0]),
    ):
        error = math.sqrt((ours.var() + their.var()) / n)
        assert abs(ours.mean() - their.mean()) < 6 * error, (ours.mean(), their.mean())
    # Each step's probability (flip 0.5, jitter 0.8, grayscale 0.2, blur 0.5), within 6 binomial sigmas
    for column, p in ((vb.FLIP, 0.5), (vb.JITTER, 0.8), (vb.GRAY, 0.2), (vb.BLUR, 0.5)):
        assert abs(rows[:, column].mean() - p) < 6 * math.sqrt(p * (1 - p) / n), column
    jittered = rows[rows[:, vb.JITTER] > 0]
    for column, low, high in (
        (vb.BRIGHTNESS, 0.6, 1.4),
        (vb.CONTRAST, 0.6, 1.4),
        (vb.SATURATION, 0.6, 1.4),
        (vb.HUE, -0.1, 0.1),
    ):
        values = jittered[:, column]
        assert low <= values.min() and values.max() <= high
        assert abs(values.mean() - (low + high) / 2) < 6 * (high - low) / math.sqrt(12 * len(values))
    orders = jittered[:, vb.ORDER]
    assert torch.equal(orders.sort(1).values, torch.arange(4.0).expand_as(orders))  # a permutation each
    firsts = torch.bincount(orders[:, 0].long(), minlength=4) / len(orders)
    assert (firsts - 0.25).abs().max() < 6 * math.sqrt(0.25 * 0.75 / len(orders))  # any step first
    blurred = rows[rows[:, vb.BLUR] > 0, vb.SIGMA]
    assert 0.1 <= blurred.min() and blurred.max() <= 2.0
    # and every range's whole width: the extremes of ~2,000-3,200 uniform draws lie within 1% of its ends
    for values, low, high in (
        (blurred, 0.1, 2.0),
        *(
            (jittered[:, column], low, high)
            for column, low, high in ((vb.BRIGHTNESS, 0.6, 1.4), (vb.SATURATION, 0.6, 1.4), (vb.HUE, -0.1, 0.1))
        ),
    ):
        assert values.min() < low + 0.01 * (high - low) and values.max() > high - 0.01 * (high - low)
    # One-channel images: no grayscale step, no saturation or hue
    gray = torch.stack([vb.ViewRecipe(32, 1, (0.2, 1.0), True, 0.0, (0.5,), (0.5,)).draw(40, 60) for _ in range(200)])
    assert gray[:, vb.GRAY].sum() == 0 and gray[:, vb.BLUR].sum() == 0
    assert (
        gray[gray[:, vb.JITTER] > 0][:, [vb.SATURATION, vb.HUE]] == torch.tensor([1.0, 0.0], dtype=torch.float64)
    ).all()


def test_a_crop_can_reach_every_edge_and_every_step_can_be_drawn_after_ten_missed_crops():
    # The last top and left places (u near 1) end the crop at the image's bottom and right edges
    uniforms = [0.5, 0.5, 1 - 1e-12, 1 - 1e-12] + [0.0] * (vb.DRAWS - 4)
    assert vb._crop_box(40, 60, (0.2, 1.0), uniforms) == [22, 2, 60, 40]
    # Ten missed crops, then a flip, jitter, grayscale and blur: each its own uniform number
    recipe = vb.ViewRecipe(16, 3, (0.2, 1.0), True, 1.0, (0.5,) * 3, (0.5,) * 3)
    for seed in range(20):
        torch.manual_seed(seed)
        row = recipe.draw(2, 100)
        assert row[vb.BLUR] == 1 and 0.1 <= row[vb.SIGMA] <= 2.0


def test_an_image_too_long_for_every_crop_gets_torchvisions_centre_crop():
    # 2 x 100: a crop of 3/4 to 4/3 aspect ratio and 20% of the area or more never fits 2 rows
    recipe = vb.ViewRecipe(16, 3, (0.2, 1.0), False, 0.0, (0.5,) * 3, (0.5,) * 3)
    top, left, height, width = T.RandomResizedCrop.get_params(torch.zeros(3, 2, 100), [0.2, 1.0], [3 / 4, 4 / 3])
    assert recipe.draw(2, 100)[:4].tolist() == [left, top, left + width, top + height]
    top, left, height, width = T.RandomResizedCrop.get_params(torch.zeros(3, 100, 2), [0.2, 1.0], [3 / 4, 4 / 3])
    assert recipe.draw(100, 2)[:4].tolist() == [left, top, left + width, top + height]


def test_the_collate_makes_each_group_of_views_in_view_order():
    # Two views: (view 1 of every sample, view 2 of every sample); multi-crop: two global and the local
    # ones; each the view its own sample's parameters give.
    torch.manual_seed(3)
    recipe = vb.ViewRecipe(16, 3, (0.08, 1.0), True, 0.0, (0.5,) * 3, (0.5,) * 3)
    images = [torch.randint(0, 256, (3, 20, 24), dtype=torch.uint8) for _ in range(5)]
    for views in (two_views(recipe), multi_crop(0.4, 3, 8, 0.05, 16, 3, True, 0.0, (0.5,) * 3, (0.5,) * 3)):
        drawn = [views((image, 0)) for image in images]
        made = views.collate(drawn)
        groups = [(recipe, count) for recipe, count in views.groups]
        assert len(made) == sum(count for _, count in groups)
        position = 0
        for group, (group_recipe, count) in enumerate(groups):
            for view in range(count):
                assert made[position].shape == (5, 3, group_recipe.size, group_recipe.size)
                for sample in range(5):
                    alone = group_recipe.make([images[sample]], [0], drawn[sample].params[group][view : view + 1])[0]
                    assert torch.equal(made[position][sample], alone)
                position += 1
    plain = views.collate([(torch.zeros(3), 1), (torch.ones(3), 2)])  # the validation loader's samples
    assert torch.equal(plain[1], torch.tensor([1, 2]))


def test_larger_8_bit_views_are_torchvisions_transforms_on_pil_images_one_image_at_a_time():
    # Above 64 px, 8-bit images take torchvision's own pipeline (the batched floats were slower
    # there: benchmarks/views.py), seeded alike; float images still take the batched path.
    recipe = vb.ViewRecipe(72, 3, (0.08, 1.0), True, 0.5, (0.5,) * 3, (0.25,) * 3)
    views = two_views(recipe)
    image = torch.randint(0, 256, (3, 80, 90), dtype=torch.uint8)
    torch.manual_seed(5)
    made = views((image, 0))
    torch.manual_seed(5)

    def blur(picture):  # PIL's own, as Lightly's GaussianBlur
        return picture.filter(ImageFilter.GaussianBlur(radius=0.1 + 1.9 * torch.rand(1).item()))

    pipeline = T.Compose(
        [
            T.ToPILImage(),
            T.RandomResizedCrop(72, scale=(0.08, 1.0)),
            T.RandomHorizontalFlip(),
            T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8),
            T.RandomGrayscale(p=0.2),
            T.RandomApply([blur], p=0.5),
            T.ToTensor(),
            T.Normalize([0.5] * 3, [0.25] * 3),
        ]
    )
    expected = [pipeline(image), pipeline(image)]
    assert isinstance(made, tuple) and all(torch.equal(a, b) for a, b in zip(made, expected))
    batch = views.collate([made, made])
    assert [tuple(b.shape) for b in batch] == [(2, 3, 72, 72)] * 2
    assert not isinstance(views((image.float() / 255, 0)), tuple)  # floats: drawn, made by the collate
    assert not isinstance(
        two_views(vb.ViewRecipe(64, 3, (0.08, 1.0), True, 0.5, (0.5,) * 3, (0.25,) * 3))((image, 0)), tuple
    )  # 64 px and under: a batch at a time
    # Validation's views are made as training's: the same pipeline from the same seed
    validation = ValidationViews([(image, 0)], recipe, lambda x: x, seed=0)[0]
    torch.manual_seed(derive_seed(0, "validation views", 0))
    assert torch.equal(validation[0], pipeline(image)) and torch.equal(validation[1], pipeline(image))
    # 2 or 4 channels (PIL would take them for gray + alpha, or RGBA): the batched path at any size
    for channels in (2, 4):
        other = vb.ViewRecipe(72, channels, (0.08, 1.0), True, 0.5, (0.5,) * channels, (0.25,) * channels)
        image = torch.randint(0, 256, (channels, 80, 90), dtype=torch.uint8)
        assert not isinstance(two_views(other)((image, 0)), tuple)
        assert ValidationViews([(image, 0)], other, lambda x: x, 0)[0][0].shape == (channels, 72, 72)
