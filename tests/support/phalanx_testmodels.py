"""Models that tests hand to phalanx as ``--model phalanx_testmodels:NAME`` (PYTHONPATH=tests/support).

They are ordinary user model factories; the environment variables only slow them down or make
one rank fail, so that tests can kill or break real workers mid-epoch.
"""

import os
import time

from phalanx.models import SmallCNN


def gate(model) -> None:
    """At training forward $PHALANX_TEST_GATE_STEP of this process, write $PHALANX_TEST_GATE/paused-rank<R>
    and wait until $PHALANX_TEST_GATE/go exists: a test signals or kills a process at a point known in
    advance, on any machine, instead of racing a timer (conftest.paused, conftest.release)."""
    step, folder = os.environ.get("PHALANX_TEST_GATE_STEP"), os.environ.get("PHALANX_TEST_GATE")
    if not step or not folder or not model.training:
        return
    model._forwards = getattr(model, "_forwards", 0) + 1
    if model._forwards != int(step):
        return
    os.makedirs(folder, exist_ok=True)
    open(os.path.join(folder, f"paused-rank{os.environ.get('RANK', '0')}"), "w").close()
    deadline = time.monotonic() + 600
    while not os.path.exists(os.path.join(folder, "go")) and time.monotonic() < deadline:
        time.sleep(0.02)


class _Slow(SmallCNN):
    def forward(self, x):
        gate(self)
        time.sleep(float(os.environ.get("PHALANX_TEST_DELAY", "0.02")))
        return super().forward(x)


class _FailsOnRank1(SmallCNN):
    calls = 0

    def forward(self, x):
        self.calls += 1
        if os.environ.get("RANK") == "1" and self.calls == 5:
            raise RuntimeError("boom from the test model on rank 1")
        return super().forward(x)


class _Raises(SmallCNN):
    def forward(self, x):
        raise RuntimeError("boom from the test model")


def raises(num_classes, in_channels):
    return _Raises(num_classes=num_classes, in_channels=in_channels)


def slow(num_classes, in_channels):
    return _Slow(num_classes=num_classes, in_channels=in_channels)


def fails_on_rank1(num_classes, in_channels):
    return _FailsOnRank1(num_classes=num_classes, in_channels=in_channels)


class _HangsOnRank1(SmallCNN):
    calls = 0

    def forward(self, x):
        self.calls += 1
        if os.environ.get("RANK") == "1" and self.calls == 5:
            # A stuck worker: the others wait for it in the gradient all-reduce. One stuck in C code
            # would take torchrun's SIGTERM only as SIGKILL, 30 s later; this one dies at the SIGTERM,
            # to keep the test short.
            import signal

            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            time.sleep(3600)
        return super().forward(x)


def hangs_on_rank1(num_classes, in_channels):
    return _HangsOnRank1(num_classes=num_classes, in_channels=in_channels)


# --- observers: models that write down what training did, for tests to compare with a reference

import hashlib  # noqa: E402

import torch  # noqa: E402


def sample_id(image: torch.Tensor) -> str:
    """A training sample's identity: a hash of its pixels (the tests map it back to the data set)."""
    return hashlib.blake2b(image.detach().float().cpu().contiguous().numpy().tobytes(), digest_size=8).hexdigest()


class _Recorder(SmallCNN):
    """Writes (when $PHALANX_TEST_RECORD is set), per process and rank, to that folder's <pid>-rank<R>.txt:
    ``B <draw> <grad>`` at each training forward (a draw from the global random stream, and the
    sum of the first parameter's gradient so far), ``T <id>`` per training sample, ``E`` per
    validation batch (so the epochs are the runs of T lines between E lines)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        folder = os.environ.get("PHALANX_TEST_RECORD")
        self._path = folder and os.path.join(folder, f"{os.getpid()}-rank{os.environ.get('RANK', '0')}.txt")
        if folder:
            os.makedirs(folder, exist_ok=True)

    def _write(self, lines):
        if self._path:
            with open(self._path, "a") as fh:
                fh.write("".join(line + "\n" for line in lines))

    def forward(self, x):
        gate(self)
        time.sleep(float(os.environ.get("PHALANX_TEST_DELAY", "0")))  # slow enough to interrupt
        if self.training:
            grad = self.features[0].weight.grad
            draw = torch.rand(()).item()
            self._write(
                [f"B {draw!r} {'none' if grad is None else repr(grad.double().sum().item())}"]
                + [f"T {sample_id(image)}" for image in x]
            )
        else:
            self._write(["E"])
        return super().forward(x)


def recorder(num_classes, in_channels):
    return _Recorder(num_classes=num_classes, in_channels=in_channels)


class _RankLogits(_Recorder):
    """Logits that do not depend on the weights: zeros on rank 0, ``RANK_OFFSET`` added to class 0
    on rank 1. Each rank's loss per sample is then known exactly from the labels it saw."""

    OFFSET = 3.0

    def forward(self, x):
        logits = 0.0 * super().forward(x)
        if os.environ.get("RANK") == "1":
            logits = logits + torch.tensor([self.OFFSET] + [0.0] * (logits.shape[1] - 1))
        return logits


def rank_logits(num_classes, in_channels):
    return _RankLogits(num_classes=num_classes, in_channels=in_channels)


class _Degrades(SmallCNN):
    """Predicts well for $PHALANX_TEST_GOOD_EPOCHS validations, then at random: best.pt must stay
    at the best epoch, not follow the latest."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.validations, self._was_training = 0, True

    def forward(self, x):
        if not self.training and self._was_training:
            self.validations += 1
        self._was_training = self.training
        logits = super().forward(x)
        if not self.training and self.validations > int(os.environ.get("PHALANX_TEST_GOOD_EPOCHS", "2")):
            return torch.randn(logits.shape, generator=torch.Generator().manual_seed(x.shape[0]))
        return logits


def degrades(num_classes, in_channels):
    return _Degrades(num_classes=num_classes, in_channels=in_channels)


class _Diverges(SmallCNN):
    """Rank 1 nudges a weight outside backward and the optimizer at its first validation: a bug
    DDP cannot see, which phalanx's end-of-run divergence check must report."""

    nudged = False

    def forward(self, x):
        if not self.training and os.environ.get("RANK") == "1" and not self.nudged:
            self.nudged = True
            with torch.no_grad():
                self.features[0].weight[0, 0, 0, 0] += 0.01
        return super().forward(x)


def diverges(num_classes, in_channels):
    return _Diverges(num_classes=num_classes, in_channels=in_channels)


class _Double(_Recorder):
    """SmallCNN in float64: DDP and one process must then agree to rounding (1e-12), not 1e-5."""

    def forward(self, x):
        return super().forward(x.double())


def double(num_classes, in_channels):
    return _Double(num_classes=num_classes, in_channels=in_channels).double()


class _BatchNormCNN(torch.nn.Module):
    def __init__(self, num_classes, in_channels):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(in_channels, 8, 3, padding=1),
            torch.nn.BatchNorm2d(8),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(2),
            torch.nn.Flatten(),
            torch.nn.Linear(32, num_classes),
        )

    def forward(self, x):
        return self.net(x)


def batchnorm(num_classes, in_channels):
    return _BatchNormCNN(num_classes, in_channels)


class _SleepInBackwardOnRank1(torch.autograd.Function):
    """Identity; its backward sleeps $PHALANX_TEST_DELAY seconds on rank 1."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        if os.environ.get("RANK") == "1":
            time.sleep(float(os.environ["PHALANX_TEST_DELAY"]))
        return grad


class _SlowBackwardOnRank1(_BatchNormCNN):
    """The BatchNorm CNN whose first convolution gets its gradient late on rank 1: rank 0 finishes
    its backward first and waits for rank 1's share of the gradient all-reduce."""

    def forward(self, x):
        x = _SleepInBackwardOnRank1.apply(self.net[0](x))
        return self.net[1:](x)


def slow_backward_on_rank1(num_classes, in_channels):
    return _SlowBackwardOnRank1(num_classes, in_channels)


class _DtypeProbe(SmallCNN):
    """Writes the dtype its first convolution computes in (autocast's, if applied) to
    $PHALANX_TEST_RECORD/dtype-<pid>.txt, once per process."""

    probed = False

    def forward(self, x):
        if self.training and not self.probed:
            self.probed = True
            os.makedirs(os.environ["PHALANX_TEST_RECORD"], exist_ok=True)
            with open(os.path.join(os.environ["PHALANX_TEST_RECORD"], f"dtype-{os.getpid()}.txt"), "w") as fh:
                fh.write(str(self.features[0](x).dtype))
        return super().forward(x)


def dtype_probe(num_classes, in_channels):
    return _DtypeProbe(num_classes=num_classes, in_channels=in_channels)


def tiny_detector(num_classes):
    """Faster R-CNN (torchvision's) on a three-layer backbone, for 64-pixel scenes: trains on a CPU
    in seconds. A user's own detector, as ``--model phalanx_testmodels:tiny_detector``."""
    from torchvision.models.detection import FasterRCNN
    from torchvision.models.detection.anchor_utils import AnchorGenerator
    from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead
    from torchvision.ops import MultiScaleRoIAlign

    backbone = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, stride=2, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 3, padding=1),
        torch.nn.ReLU(),
    )
    backbone.out_channels = 64
    return FasterRCNN(
        backbone,
        min_size=64,
        max_size=64,
        box_head=TwoMLPHead(64 * 7 * 7, 128),
        box_predictor=FastRCNNPredictor(128, num_classes),
        rpn_anchor_generator=AnchorGenerator(sizes=((16, 24, 32),), aspect_ratios=((1.0,),)),
        box_roi_pool=MultiScaleRoIAlign(featmap_names=["0"], output_size=7, sampling_ratio=2),
        rpn_pre_nms_top_n_train=300,
        rpn_post_nms_top_n_train=100,
        rpn_pre_nms_top_n_test=100,
        rpn_post_nms_top_n_test=50,
        box_batch_size_per_image=64,
        box_detections_per_img=20,
    )


def tiny_segmenter(num_classes):
    """A four-layer fully convolutional segmenter: logits at the input's size."""
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, padding=2, dilation=2),
        torch.nn.ReLU(),
        torch.nn.Conv2d(32, 32, 3, padding=4, dilation=4),
        torch.nn.ReLU(),
        torch.nn.Conv2d(32, num_classes, 1),
    )


class _FormatProbe(SmallCNN):
    """Writes the memory format of its first training input to $PHALANX_TEST_RECORD/format-<pid>.txt."""

    probed = False

    def forward(self, x):
        if self.training and not self.probed:
            self.probed = True
            os.makedirs(os.environ["PHALANX_TEST_RECORD"], exist_ok=True)
            fmt = (
                "channels_last"
                if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
                else "contiguous"
            )
            with open(os.path.join(os.environ["PHALANX_TEST_RECORD"], f"format-{os.getpid()}.txt"), "w") as fh:
                fh.write(fmt)
        return super().forward(x)


def format_probe(num_classes, in_channels):
    return _FormatProbe(num_classes=num_classes, in_channels=in_channels)


SEEN_BATCHES: list[tuple[str, int]] = []


class _ShardProbe(SmallCNN):
    """Writes down the device and size of every training forward's input in SEEN_BATCHES (this
    process): under DataParallel each replica sees its share of the batch."""

    def forward(self, x):
        if self.training:
            SEEN_BATCHES.append((str(x.device), x.shape[0]))
        return super().forward(x)


def shard_probe(num_classes, in_channels):
    return _ShardProbe(num_classes=num_classes, in_channels=in_channels)


class _InfiniteGradient(SmallCNN):
    """A finite loss whose gradient is infinite (d sqrt(w)/dw at w = 0): after the first optimizer
    step one weight is -inf at any --lr, as --lr inf made every weight. A loss check alone sees
    nothing at that step."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.zero = torch.nn.Parameter(torch.zeros(()))

    def forward(self, x):
        return super().forward(x) + torch.sqrt(self.zero)


def infinite_gradient(num_classes, in_channels):
    return _InfiniteGradient(num_classes=num_classes, in_channels=in_channels)


def exit_work(num_classes, in_channels):
    """A SmallCNN whose maker leaves work for the process's exit, as a user's code can: a thread (not
    a daemon) that writes a file half a second after the process starts to exit, an exit function
    that writes another, and a thread pool left alive (as --compile's kernel compiler leaves one),
    whose idle worker only the interpreter's shutdown hooks wake. Both files are in
    $PHALANX_TEST_EXIT_DIR afterwards, or the exit lost them; a wrong exit hangs on the pool."""
    import atexit
    import sys
    import threading
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    folder = Path(os.environ["PHALANX_TEST_EXIT_DIR"])
    main = threading.main_thread().ident

    def exiting() -> bool:
        frame = sys._current_frames().get(main)
        while frame is not None:
            if frame.f_code.co_name == "exit_process":
                return True
            frame = frame.f_back
        return False

    def late_writer():
        deadline = time.monotonic() + 120
        while not exiting():
            if time.monotonic() > deadline:
                return  # the run never ended: no file, and the test says so
            time.sleep(0.02)
        time.sleep(0.5)
        (folder / "thread.txt").write_text("written by a thread after the run")

    threading.Thread(target=late_writer, daemon=False).start()
    atexit.register(lambda: (folder / "atexit.txt").write_text("written at exit"))
    pool = ThreadPoolExecutor(1)
    pool.submit(int).result()
    _kept.append(pool)
    return SmallCNN(num_classes, in_channels)


_kept: list = []  # the pool outlives the maker, never shut down
