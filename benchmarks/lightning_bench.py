"""The same training in PyTorch Lightning (run from its own virtual environment).

python benchmarks/lightning_bench.py MODEL BATCH STEPS WARMUP DEVICES
"""

import sys
import time

import lightning as L
import torch
from common import build_model, report, synthetic


class Classifier(L.LightningModule):
    def __init__(self, model_name: str):
        super().__init__()
        self.model = build_model(model_name)
        self.loss_fn = torch.nn.CrossEntropyLoss()

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        return self.loss_fn(self.model(inputs), targets)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)


class Timer(L.Callback):
    def __init__(self, warmup: int):
        self.warmup, self.first, self.start = warmup, None, None

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if batch_idx == 0:
            self.first = time.time()
        if batch_idx + 1 == self.warmup:
            self.start = time.perf_counter()

    def on_train_end(self, trainer, module):
        self.seconds = time.perf_counter() - self.start


def main(model_name: str, batch: int, steps: int, warmup: int, devices: int) -> None:
    torch.manual_seed(0)
    data = synthetic(steps * batch * devices)
    loader = torch.utils.data.DataLoader(data, batch_size=batch, shuffle=True)
    timer = Timer(warmup)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        max_steps=steps,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[timer],
    )
    trainer.fit(Classifier(model_name), loader)
    if trainer.global_rank == 0:
        report(first_step_time=timer.first, samples=(steps - warmup) * batch * devices, seconds=timer.seconds)


if __name__ == "__main__":
    main(sys.argv[1], *map(int, sys.argv[2:6]))
