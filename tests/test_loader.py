"""The input pipeline: fast decoding within the stated tolerance of the reference path, a folder
manifest that checks each file once, broken files named among thousands, flat sample arrays."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from phalanx_testdata import photo

from phalanx.config import RunConfig
from phalanx.data import build_datasets, loader_workers, manifest
from phalanx.data.images import DRAFT_MIN_SIDE, DRAFT_REDUCTION, PathTable, decode, jpeg_size
from phalanx.data.transforms import Prepare
from phalanx.errors import PhalanxError
from phalanx.system import cores

# Stated in docs/training.md ("Input pipeline"): a reduced-scale JPEG decode differs from a full decode
# plus antialiased resize by at most this much, in [0, 1] units, after the pipeline's resize.
# Measured: mean 1.5/255, largest 9/255 (docs/training.md, "Input pipeline").
MEAN_TOLERANCE, MAX_TOLERANCE = 2 / 255, 16 / 255


@pytest.mark.slow
@pytest.mark.parametrize(
    "width, height, size", [(160, 160, 32), (500, 375, 64), (500, 375, 224), (640, 480, 224), (1200, 900, 100)]
)
def test_fast_jpeg_decoding_gives_the_reference_image_within_tolerance(width, height, size):
    from torchvision.io import decode_jpeg

    prepare = Prepare(size, size, (0.0,) * 3, (1.0,) * 3)
    reduced = min(width, height) >= max(DRAFT_REDUCTION * size, DRAFT_MIN_SIDE)
    # 160 px is 4 x 32, but below DRAFT_MIN_SIDE: decode_jpeg, whole (faster there, measured)
    assert reduced is ((width, height, size) in ((500, 375, 64), (1200, 900, 100)))
    worst_mean = worst_max = 0.0
    for seed in range(8):
        data = photo(width, height, seed)
        decoded = decode(data, "RGB", size, fast=True)
        if reduced:  # the reduced-scale path was taken: a quarter of each side
            assert decoded.shape[-2:] == ((height + 3) // 4, (width + 3) // 4)
        else:  # torchvision's decode_jpeg, untouched
            assert torch.equal(decoded, decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8)))
        reference = prepare(decode(data, "RGB", None, fast=False))  # PIL, full decode
        difference = (reference - prepare(decoded)).abs()
        worst_mean, worst_max = max(worst_mean, difference.mean().item()), max(worst_max, difference.max().item())
    assert worst_mean <= MEAN_TOLERANCE and worst_max <= MAX_TOLERANCE
    if not reduced:  # PIL's libjpeg and torchvision's libjpeg-turbo: at most a unit of rounding apart
        assert worst_max <= 1 / 255 + 1e-6


def test_images_wider_than_8_bits_are_scaled_by_their_types_range_not_clipped_white():
    # PIL's convert("L"/"RGB") clips 16-bit and float pixels at 255: a newcomer's 16-bit ramp, its
    # mirror and a flat image gave bit-identical features. As DeepLIIF's reader (and phalanx's
    # slides) scale them: to [0, 1] by the type's range (floats as [0, 1]), x 255, truncated.
    import tifffile
    from PIL import Image

    ramp = np.tile(np.linspace(1000, 65535, 24).astype(np.uint16), (5, 1))
    expected = (ramp / 65535 * 255).astype(np.uint8)  # by hand
    files = {}
    for fmt in ("PNG", "TIFF"):
        buffer = io.BytesIO()
        Image.fromarray(ramp).save(buffer, fmt)  # PIL reads both back as I;16
        files[fmt] = buffer.getvalue()
    wide = ramp.astype(np.int64) * 32768  # 32-bit integers over their range (PIL's "I"), the same ramp
    buffer = io.BytesIO()
    tifffile.imwrite(buffer, wide.astype(np.int32))
    files["I"] = buffer.getvalue()
    floats = io.BytesIO()
    Image.fromarray((ramp / 65535).astype(np.float32)).save(floats, "TIFF")  # PIL's "F", in [0, 1]
    for name, data in files.items():
        assert Image.open(io.BytesIO(data)).mode == ("I" if name == "I" else "I;16"), name
        by_hand = (wide / (2**31 - 1) * 255).astype(np.uint8) if name == "I" else expected
        assert np.array_equal(decode(data, "L", None, fast=True)[0].numpy(), by_hand), name
    gray = decode(files["PNG"], "RGB", None, fast=True)
    assert gray.shape == (3, 5, 24) and all(np.array_equal(channel.numpy(), expected) for channel in gray)
    as_float = decode(floats.getvalue(), "L", None, fast=True)[0].numpy().astype(int)
    assert np.abs(as_float - expected).max() <= 1  # float32's rounding of x / 65535
    assert len(np.unique(expected)) > 20  # a ramp, not white


def test_the_frame_header_reader_agrees_with_pil_and_survives_garbage():
    from PIL import Image

    rng = np.random.default_rng(0)
    for width, height in [(1, 1), (17, 300), (640, 480), (4000, 3000)]:
        pixels = Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8))
        for options in [{}, {"progressive": True}, {"exif": b"Exif\x00\x00" + bytes(5000)}, {"quality": 20}]:
            buffer = io.BytesIO()
            pixels.save(buffer, "JPEG", **options)
            assert jpeg_size(buffer.getvalue()) == (width, height), options
        buffer = io.BytesIO()
        pixels.convert("L").save(buffer, "JPEG")
        assert jpeg_size(buffer.getvalue()) == (width, height)
    assert jpeg_size(photo(64, 48, 0)[:40]) is None  # cut before the frame header
    for _ in range(2000):  # whatever the bytes, an answer or None: no exception, no endless loop
        junk = b"\xff\xd8" + rng.integers(0, 256, int(rng.integers(0, 64)), dtype=np.uint8).tobytes()
        size = jpeg_size(junk)
        assert size is None or (len(size) == 2 and min(size) > 0)


def test_grayscale_and_png_go_through_pil():
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (20, 10), (10, 200, 30)).save(buffer, "PNG")
    assert decode(buffer.getvalue(), "L", 8, fast=True).shape == (1, 10, 20)
    assert decode(photo(64, 48, 0), "L", None, fast=True).shape == (1, 48, 64)


def test_jpegs_decode_as_torchvisions_decode_jpeg_does_pixel_for_pixel(monkeypatch):
    # phalanx calls torchvision's registered decoder op, not its deprecated Python wrapper: the
    # wrapper's pixels, in colour and in grey. Without the op (torchvision's image extension did
    # not load), PIL decodes, as --no-fast-decode does.
    import warnings

    from torchvision.io import ImageReadMode, decode_jpeg

    from phalanx.data import images

    op_path = images._torchvision_jpeg()
    assert op_path is not None and op_path.__name__ == "<lambda>"  # the op itself, not a wrapper
    for mode, name in (("RGB", "RGB"), ("L", "GRAY")):
        for seed in range(3):
            data = photo(64, 48, seed)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                expected = decode_jpeg(
                    torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=getattr(ImageReadMode, name)
                )
            assert expected.shape == ((3 if mode == "RGB" else 1), 48, 64)
            assert torch.equal(decode(data, mode, None, fast=True), expected)
            assert torch.equal(op_path(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode), expected)
    monkeypatch.setattr(torch, "ops", object())  # a torchvision whose op cannot be found
    assert images._torchvision_jpeg.__wrapped__() is None
    monkeypatch.undo()
    monkeypatch.setattr(images, "_torchvision_jpeg", lambda: None)
    data = photo(64, 48, 0)
    assert torch.equal(decode(data, "RGB", None, fast=True), decode(data, "RGB", None, fast=False))


def test_a_file_is_read_whole_without_allocating_the_limit_and_refused_beyond_it(tmp_path, monkeypatch):
    import threading
    import tracemalloc

    from phalanx.data import images

    started_here = not tracemalloc.is_tracing()
    if started_here:
        tracemalloc.start()

    def allocated_by(read):
        """What ``read()`` allocated at its peak beyond what was held before it, and its result."""
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        try:
            return read(), tracemalloc.get_traced_memory()[1] - before
        except ValueError:
            return None, tracemalloc.get_traced_memory()[1] - before

    try:
        for size in (0, 1, 5000, images.READ_ON_BYTES + 7, 300_000):
            path = tmp_path / f"{size}.bin"
            path.write_bytes(os.urandom(size))
            data, peak = allocated_by(lambda path=path: images.read_bounded(path))
            assert data == path.read_bytes()
            # A read of the limit (256 MiB) allocated that much for every image.
            assert peak < 2 * size + 4 * images.READ_ON_BYTES, (size, peak)
        # A file that says it is over the limit is refused before anything is read.
        monkeypatch.setattr(images, "MAX_FILE_BYTES", 1024 * 1024)
        (tmp_path / "big").write_bytes(bytes(3 * 1024 * 1024))
        data, peak = allocated_by(lambda: images.read_bounded(tmp_path / "big"))
        assert data is None and peak < 4 * images.READ_ON_BYTES, peak
        monkeypatch.undo()
    finally:
        if started_here:
            tracemalloc.stop()
    # Files that state no size: /proc's, a pipe.
    assert images.read_bounded("/proc/self/cmdline") == open("/proc/self/cmdline", "rb").read()
    writers = []

    def fifo_of(count: int):
        fifo = tmp_path / f"fifo{count}"
        os.mkfifo(fifo)

        def write():
            with open(fifo, "wb") as fh:
                try:
                    fh.write(b"x" * count)
                except BrokenPipeError:  # the reader stopped at the limit
                    pass

        writers.append(threading.Thread(target=write, daemon=True))
        writers[-1].start()
        return fifo

    assert images.read_bounded(fifo_of(200_000)) == b"x" * 200_000
    monkeypatch.setattr(images, "MAX_FILE_BYTES", 1000)
    (tmp_path / "limit").write_bytes(bytes(1000))
    assert len(images.read_bounded(tmp_path / "limit")) == 1000
    (tmp_path / "over").write_bytes(bytes(1001))
    for over in (tmp_path / "over", fifo_of(10_000_000)):
        with pytest.raises(ValueError, match="larger than"):
            images.read_bounded(over)
    for writer in writers:
        writer.join(timeout=30)
        assert not writer.is_alive()


def make_folder(root, files_per_class: int, classes: int = 3):
    from PIL import Image

    image = Image.new("L", (6, 6), 128)
    for c in range(classes):
        folder = root / "train" / f"class{c}"
        folder.mkdir(parents=True)
        for i in range(files_per_class):
            image.save(folder / f"{i:05d}.png")
    return root


def test_the_manifest_checks_each_file_once_and_rechecks_only_what_changed(tmp_path, monkeypatch):
    root = make_folder(tmp_path / "data", files_per_class=40)
    calls = []
    original = manifest.check_file
    monkeypatch.setattr(manifest, "check_file", lambda path: calls.append(path) or original(path))
    monkeypatch.setattr(manifest, "PARALLEL_FROM", 10**9)  # in this process, so the calls are counted
    first = manifest.checked(root / "train")
    assert len(calls) == 120 and len(first.paths) == 120 and not first.broken
    calls.clear()
    assert manifest.checked(root / "train").paths == first.paths and calls == []
    broken = root / "train/class1/00007.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n not an image any more")
    third = manifest.checked(root / "train")
    assert calls == [str(broken.resolve())]
    assert third.broken == {"class1/00007.png": "UnidentifiedImageError"} and len(third.paths) == 119


def test_a_broken_file_among_thousands_is_named_or_skipped_and_counted(tmp_path, phalanx):
    root = make_folder(tmp_path / "data", files_per_class=1000)  # checked in parallel processes
    (root / "train/class2/00500.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    with pytest.raises(PhalanxError, match=r"class2/00500.png \(\w+Error\); --skip-broken"):
        build_datasets(RunConfig.flat(dataroot=str(root)), None)
    data = build_datasets(RunConfig.flat(dataroot=str(root), skip_broken=True), None)
    assert len(data.train) + len(data.val) == 2999 and "1 unreadable image(s) left out" in data.description
    assert list(data.skipped) == [str(root / "train/class2/00500.png")]


def test_samples_are_held_in_flat_arrays():
    table = PathTable([f"class{i % 7}/{i:07d}.jpg" for i in range(10_000)] + ["é/ü.png"])
    assert len(table) == 10_001 and table[1234] == "class2/0001234.jpg" and table[10_000] == "é/ü.png"
    assert isinstance(table.blob, np.ndarray) and isinstance(table.offsets, np.ndarray)  # two objects, not 10,001


def test_num_workers_auto_gives_loader_workers_the_cores_training_leaves_free(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)  # any machine: 8 cores
    monkeypatch.setattr(cores, "cpu_quota", lambda: None)  # and no CPU quota
    auto = RunConfig().data.num_workers
    assert loader_workers(auto, local_processes=1, training_threads=8) == 0  # CPU training: none
    assert loader_workers(auto, local_processes=1, training_threads=1) == 7  # one GPU
    assert loader_workers(auto, local_processes=4, training_threads=1) == 1  # four GPU workers
    assert loader_workers(RunConfig.flat(num_workers="3").data.num_workers, local_processes=8, training_threads=1) == 3


def test_a_process_given_fewer_cores_than_the_machine_sizes_threads_and_process_pools_by_them(tmp_path, monkeypatch):
    # A job given 3 cores of a 64-core node (SLURM's --cpus-per-task, taskset): the manifest's check
    # once started os.cpu_count() processes, 64 on 3 cores.
    from phalanx.distributed.devices import cpu_threads_per_worker

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {4, 5, 6}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(cores, "cpu_quota", lambda: None)
    assert cpu_threads_per_worker(1) == 3 and loader_workers(RunConfig().data.num_workers, 1, 1) == 2
    pools = []

    class Pool:  # records the size, runs the checks in this process
        def __init__(self, max_workers, mp_context):
            pools.append(max_workers)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def map(self, fn, items, chunksize):
            return map(fn, items)

    monkeypatch.setattr(manifest, "ProcessPoolExecutor", Pool)
    monkeypatch.setattr(manifest, "PARALLEL_FROM", 10)
    root = make_folder(tmp_path / "data", files_per_class=10)
    assert len(manifest.checked(root / "train").paths) == 30 and pools == [3]


def test_basic_augmentation_of_small_images_is_a_padded_crop_and_a_flip(monkeypatch):
    """PadCropFlip (phalanx's fast path) against the recipe it replaces, written out: pad with black,
    crop at the drawn corner, flip when drawn; every draw."""
    from phalanx.data.transforms import PadCropFlip

    prepare = Prepare(8, 8, (0.5,), (0.25,))
    image = torch.arange(64, dtype=torch.uint8).view(1, 8, 8) * 3
    augment = PadCropFlip(prepare, 2, flip=True)
    span = 5
    for draw in range(span * span * 2):
        monkeypatch.setattr(torch, "randint", lambda *args, draw=draw, **kwargs: torch.tensor(draw))
        top, left, flipped = draw // (2 * span), draw // 2 % span, draw % 2 == 1
        expected = torch.nn.functional.pad(image, (2,) * 4)[:, top : top + 8, left : left + 8]
        expected = prepare.scale(expected.flip(-1) if flipped else expected)
        assert torch.equal(augment(image), expected), draw


def test_in_memory_images_are_transformed_once_and_in_place_only_where_nothing_reads_them_raw():
    from phalanx.data import _in_chunks

    images = torch.rand(600, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    normalise = lambda x: (x - 0.5) / 0.5  # noqa: E731
    expected = torch.cat([normalise(part) for part in images.split(256)])  # three chunks, the last short
    mine = images.clone()
    assert _in_chunks(normalise, mine, in_place=True).data_ptr() == mine.data_ptr() and torch.equal(mine, expected)
    kept = images.clone()
    out = _in_chunks(normalise, kept)
    assert out.data_ptr() != kept.data_ptr() and torch.equal(out, expected) and torch.equal(kept, images)
    resize = lambda x: torch.nn.functional.interpolate(x, size=12)  # noqa: E731
    grown = _in_chunks(resize, images.clone(), in_place=True)  # another shape: a new tensor
    assert grown.shape == (600, 3, 12, 12) and torch.equal(grown, resize(images))
    # In a run: the built-in digits without augmentation are normalised where they lie; with it,
    # training reads the raw images, which stay as loaded.
    for augment, shared in (("none", True), ("basic", False)):
        bundle = build_datasets(RunConfig.flat(augment=augment, image_size=16), None)
        plain, raw = bundle.train.plain.images, bundle.train.raw.images
        assert (plain.data_ptr() == raw.data_ptr()) is shared
        assert plain.min() < -0.5 and (shared or raw.min() >= 0)


def test_a_hold_out_split_in_place_is_the_gathered_split():
    from phalanx.data.sources import holdout_indices, split_in_place

    images = torch.rand(50, 2, 3, 3, generator=torch.Generator().manual_seed(1))
    train_idx, val_idx = holdout_indices(50, 0.3, seed=4)
    for chunk in (1, 3, 7, 256):  # rows moved a chunk at a time, never over a row still to be read
        mine = images.clone()
        train, val = split_in_place(mine, train_idx, val_idx, chunk=chunk)
        assert torch.equal(train, images[train_idx]) and torch.equal(val, images[val_idx])
        assert train.data_ptr() == mine.data_ptr()  # no second copy of the training rows


QUOTA_PROBE = """
import json, torch
from phalanx.system import cores
from phalanx.config import RunConfig
from phalanx.data import loader_workers
from phalanx.distributed.strategy import Strategy
Strategy(torch.device("cpu"))
print(json.dumps([cores.cpu_quota(), cores.available_cores(), torch.get_num_threads(),
                  loader_workers(RunConfig().data.num_workers, 1, 1)]))
"""


def test_a_cpu_quota_sizes_threads_and_loader_workers_as_an_affinity_does():
    # A container's --cpus or a Kubernetes CPU limit is a cgroup quota, not an affinity: torch and
    # os.cpu_count() see every core. A real cgroup (v1's cpu controller) with half a core's quota,
    # the process in a cgroup below it: one core, one thread, no loader worker.
    mounted = [d for d in cores._cpu_cgroup_directories() if (d / "cpu.cfs_quota_us").exists()]
    if not mounted or not os.access(mounted[0], os.W_OK):
        pytest.skip("needs a cgroup v1 cpu controller this user may write (root)")
    group = mounted[0] / f"phalanx-test-{os.getpid()}"
    inner = group / "inner"
    inner.mkdir(parents=True)
    try:
        period = int((group / "cpu.cfs_period_us").read_text())
        (group / "cpu.cfs_quota_us").write_text(str(period // 2))
        run = f'echo $$ > {inner}/cgroup.procs && exec "{sys.executable}" -c "$0"'
        done = subprocess.run(["sh", "-c", run, QUOTA_PROBE], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == [0.5, 1, 1, 0]
    finally:
        inner.rmdir()
        group.rmdir()


@pytest.mark.parametrize("mount_root", ["/", "/kubepods/pod1"], ids=["host-view", "cgroup-namespace"])
def test_a_cgroup_v2_quota_is_the_smallest_up_the_hierarchy(tmp_path, monkeypatch, mount_root):
    # cgroup v2's cpu controller does not run on this machine (its v2 hierarchy has none), so the
    # files the kernel would show are written here: a pod limited to 1.5 cores, its container to
    # none, a mount point with a space (mountinfo writes it \040), and a sibling cgroup with a lower
    # quota that is not this process's; seen from the host and from inside a cgroup namespace.
    mount = tmp_path / "cg root"
    pod = mount / "kubepods/pod1" if mount_root == "/" else mount
    (pod / "ctr").mkdir(parents=True)
    # the host sees the pod's limit above the container; a namespace sees its own cgroup's
    limited, unlimited = (pod, pod / "ctr") if mount_root == "/" else (pod / "ctr", pod)
    limited.joinpath("cpu.max").write_text("150000 100000\n")
    unlimited.joinpath("cpu.max").write_text("max 100000\n")
    (mount / "kubepods/pod10").mkdir(parents=True)
    (mount / "kubepods/pod10/cpu.max").write_text("10000 100000\n")
    escaped = str(mount).replace(" ", "\\040")
    proc = {
        "/proc/self/cgroup": "0::/kubepods/pod1/ctr\n",
        "/proc/self/mountinfo": "22 1 0:20 / /sys rw - sysfs sysfs rw\n"
        f"35 22 0:30 {mount_root} {escaped} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n",
    }
    real = cores._read
    monkeypatch.setattr(cores, "_read", lambda path: proc[path] if str(path) in proc else real(path))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert cores.cpu_quota() == 1.5 and cores.available_cores() == 2
    limited.joinpath("cpu.max").write_text("max 100000\n")  # no limit anywhere: the affinity's 8
    assert cores.cpu_quota() is None and cores.available_cores() == 8
