"""Models that tests hand to phalanx as ``--model phalanx_testmodels:NAME`` (PYTHONPATH=tests/support).

They are ordinary user model factories; the environment variables only slow them down or make
one rank fail, so that tests can kill or break real workers mid-epoch.
"""

import os
import time

from phalanx.models import SmallCNN


class _Slow(SmallCNN):
    def forward(self, x):
        time.sleep(float(os.environ.get("PHALANX_TEST_DELAY", "0.02")))
        return super().forward(x)


class _FailsOnRank1(SmallCNN):
    calls = 0

    def forward(self, x):
        self.calls += 1
        if os.environ.get("RANK") == "1" and self.calls == 5:
            raise RuntimeError("boom from the test model on rank 1")
        return super().forward(x)


def slow(num_classes, in_channels):
    return _Slow(num_classes=num_classes, in_channels=in_channels)


def fails_on_rank1(num_classes, in_channels):
    return _FailsOnRank1(num_classes=num_classes, in_channels=in_channels)


class _HangsOnRank1(SmallCNN):
    calls = 0

    def forward(self, x):
        self.calls += 1
        if os.environ.get("RANK") == "1" and self.calls == 5:
            time.sleep(3600)  # a stuck worker: the others wait for it in the gradient all-reduce
        return super().forward(x)


def hangs_on_rank1(num_classes, in_channels):
    return _HangsOnRank1(num_classes=num_classes, in_channels=in_channels)

