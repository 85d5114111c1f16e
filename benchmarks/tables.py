"""docs/benchmarks.md, generated from benchmarks/results/*.json: every table of measurements, each
row with the date, commit and machine it was measured on (the JSON's ``provenance`` block).

    .venv/bin/python benchmarks/tables.py            # rewrite docs/benchmarks.md
    .venv/bin/python benchmarks/tables.py --check    # exit 1 if docs/benchmarks.md is not what this writes

Deterministic: the same JSON files give the same page, byte for byte (tests/test_docs.py checks the
page against this script). Values are printed as measured; a ratio whose per-repeat range holds 1 is
called parity, a lead only when every repeat is above 1. A result file the page does not know is
listed at the end, so a new benchmark shows up until a table is written for it here.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "benchmarks.md"
MEASURED = "measured (date, commit, machine)"


def load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def provenance(data: dict, name: str) -> str:
    found = data.get("provenance", {})
    missing = [key for key in ("date", "commit", "machine") if not found.get(key)]
    if missing:
        raise SystemExit(
            f'benchmarks/tables.py: {name} has no {", ".join(missing)} in its "provenance" block '
            '({"date": ..., "commit": ..., "machine": ...}): add them'
        )
    return f"{found['date']}, {found['commit']}, {found['machine']}"


def spread(stats: dict | Sequence[float], digits: int = 0, scale: float = 1.0, unit: str = "") -> str:
    """``median (min-max)`` of a summary (``median``/``mean``, ``min``, ``max``) or of raw values."""
    if isinstance(stats, dict):
        centre = stats["median"] if "median" in stats else stats["mean"]
        low, high = stats["min"], stats["max"]
    else:
        centre, low, high = statistics.median(stats), min(stats), max(stats)
    f = lambda v: f"{v * scale:.{digits}f}"  # noqa: E731
    return f"{f(centre)}{unit} ({f(low)}-{f(high)})"


def verdict(ratio: dict | Sequence[float]) -> str:
    low, high = (ratio["min"], ratio["max"]) if isinstance(ratio, dict) else (min(ratio), max(ratio))
    if (ratio["n"] if isinstance(ratio, dict) else len(ratio)) < 3:
        return "too few repeats"
    return "lead" if low > 1 else "behind" if high < 1 else "parity"


def table(header: Sequence[str], rows: list[Sequence[str]], measured: str) -> list[str]:
    lines = ["| " + " | ".join([*header, MEASURED]) + " |", "|" + " --- |" * (len(header) + 1)]
    return lines + ["| " + " | ".join([*map(str, row), measured]) + " |" for row in rows] + [""]


# --- one function per result file (or family): the page's sections ---------------------------------
def training_loop() -> list[str]:
    data = load("latest.json")
    at = provenance(data, "latest.json")
    rows = []
    for model, runs in data["runs"].items():
        for contender, run in runs.items():
            ratio = data["ratios"][model][contender]
            baseline = contender.startswith("hand-written")
            rows.append(
                [
                    model,
                    contender,
                    spread(run["samples_per_s"]),
                    "baseline" if baseline else spread(ratio, 3),
                    "" if baseline else verdict(ratio),
                    spread(run["first_step_s"], 2),
                    spread(run["wall_s"], 1),
                    spread(run["rss_mb"]),
                ]
            )
    lines = [
        "### phalanx against a hand-written loop (`benchmarks/run.py`)",
        "",
        "Synthetic 32x32 RGB data in memory, the same model, per-process batch, SGD (momentum 0.9, weight "
        "decay 5e-4) and steps ("
        + "; ".join(
            f"{model}: batch {batch}, {steps} steps, timed after step {warmup}"
            for model, (batch, steps, warmup) in data["settings"].items()
        )
        + f"); torch {data['versions']['torch']}, "
        f"torchvision {data['versions']['torchvision']}. Ratios per repeat against the hand-written loop "
        "run next to it.",
        "",
    ]
    lines += table(
        [
            "model",
            "contender",
            "samples/s",
            "/ hand-written, per repeat",
            "verdict",
            "first step (s)",
            "wall (s)",
            "peak RSS (MB)",
        ],
        rows,
        at,
    )
    extras = [[name, spread(run["samples_per_s"]), spread(run["wall_s"], 1)] for name, run in data["extras"].items()]
    lines += ["phalanx train, smallcnn, what the progress bar and snapshots cost:", ""]
    lines += table(["setting", "samples/s", "wall (s)"], extras, at)
    lines += table(
        ["command", "time to print its help (ms)"],
        [["`phalanx --help`", spread(data["help_startup_s"], 0, 1000) + f", {data['help_startup_s']['n']} runs"]],
        at,
    )
    return lines


def first_step() -> list[str]:
    data = load("first_step.json")
    at = provenance(data, "first_step.json")
    s, d = data["first_step_s"], data["difference_s"]
    sooner = lambda diff: "parity" if diff["min"] < 0 < diff["max"] else "sooner" if diff["max"] < 0 else "later"  # noqa: E731
    rows = [
        [
            "1 process",
            spread(s["hand-written, 1 process"], 2),
            spread(s["phalanx train"], 2),
            spread(d["1 process"], 2),
            sooner(d["1 process"]),
        ],
        [
            "2 DDP workers",
            spread(s["hand-written DDP, 2 workers"], 2),
            spread(s["phalanx trainlaunch, 2 workers"], 2),
            spread(d["2 DDP workers"], 2),
            sooner(d["2 DDP workers"]),
        ],
    ]
    return [
        "### When the first step ends (`benchmarks/first_step.py`)",
        "",
        "smallcnn at `benchmarks/run.py`'s settings, process start to the end of the first optimizer step, "
        "7 interleaved repeats.",
        "",
    ] + table(
        ["world", "hand-written (s)", "phalanx (s)", "phalanx - hand-written, per repeat (s)", "verdict"], rows, at
    )


def breakdown_cost() -> list[str]:
    data = load("breakdown_cost.json")
    at = provenance(data, "breakdown_cost.json")
    rows = [
        [run, spread(raw["on"]), spread(raw["off"]), spread(data["ratios"][run], 3), verdict(data["ratios"][run])]
        for run, raw in data["raw"].items()
    ]
    return [
        "### What the step-time breakdown costs (`benchmarks/breakdown_cost.py`)",
        "",
        "The same runs with the breakdown's clock reads, collective timers and gradient hooks replaced by "
        "nothing; samples/s, 7 interleaved repeats.",
        "",
    ] + table(["run", "breakdown on", "breakdown off", "off / on, per repeat", "verdict"], rows, at)


def exit_latency() -> list[str]:
    data = load("exit_latency.json")
    found = data["provenance"]
    rows = []
    for key, run in data.items():
        if key == "provenance":
            continue
        commit, command = key.split("|")
        rows.append(
            [
                commit,
                command,
                spread(run["wall"], 2),
                spread(run["tail"], 2),
                f"{found['date']}, {commit}, {found['machine']}",
            ]
        )
    lines = [
        "### How long a command takes to end (`benchmarks/exit_latency.py`)",
        "",
        "Each row names the checkout it ran: 2341629 before commands stopped finalising torch at exit, "
        "908f268 after. 7 interleaved repeats.",
        "",
    ]
    header = ["checkout (commit)", "command", "wall (s)", "last line to exit (s)"]
    lines += ["| " + " | ".join([*header, MEASURED]) + " |", "|" + " --- |" * (len(header) + 1)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows] + [""]


def optimizer_step() -> list[str]:
    data = load("optimizer_step.json")
    at = provenance(data, "optimizer_step.json")
    rows = []
    for workload, ms in data["ms_per_step"].items():
        rows.append(
            [
                workload,
                *(spread(ms[k], 2) for k in ("loop", "foreach", "fused")),
                f"{ms['loop']['median'] / ms['fused']['median']:.1f}x",
            ]
        )
    return [
        "### One optimizer step (`benchmarks/optimizer_step.py`)",
        "",
        f"torch {data['torch']}, one thread, 7 repeats; ms a step.",
        "",
    ] + table(["workload", "loop (ms)", "foreach (ms)", "fused (ms)", "loop / fused"], rows, at)


def loader_throughput() -> list[str]:
    lines = [
        "### Loader throughput (`benchmarks/loader.py --only throughput`)",
        "",
        "1,500 random images of generated JPEG folders, decode + resize + centre crop + normalise (the "
        "`phalanx <policy>` rows: training augmentation), batch 64; images/s, medians of 7 interleaved "
        "repeats. The 2026-11-21 rows are before the read fix and the decoder imported ahead of the "
        "workers.",
        "",
    ]
    rows, ats = [], []
    for name in ("loader-throughput-small.json", "loader-throughput-large.json", "loader.json"):
        data = load(name)
        at = provenance(data, name)
        for key, stats in data["throughput"].items():
            size, workers, contender = key.split("|")
            images = "160x160 -> 32" if size == "small" else "600x500 -> 224"
            rows.append([images, workers, contender, spread(stats)])
            ats.append(at)
    header = ["images", "workers", "contender", "images/s"]
    lines += ["| " + " | ".join([*header, MEASURED]) + " |", "|" + " --- |" * (len(header) + 1)]
    return lines + ["| " + " | ".join([*row, at]) + " |" for row, at in zip(rows, ats)] + [""]


PAIRS = {
    "phalanx --augment none": "hand-written loop",
    "phalanx --augment none --no-fast-decode": "hand-written loop",
    "phalanx default (basic: pad-crop + flip)": "hand-written loop, torchvision pad-crop + flip",
}


def loader_endtoend() -> list[str]:
    lines = [
        "### Training end to end on JPEG folders (`benchmarks/loader.py --only endtoend`)",
        "",
        "A model that costs nothing (`AdaptiveAvgPool2d(8)` + `Linear`), one process, `--num-workers 0`, one "
        "thread, 160x160 JPEGs to 32 px, batch 64; phalanx's rate is its second epoch's. Ratios per repeat "
        "against the hand-written loop of the same augmentation. The 2026-11-27 rows ran on commit 21ea2d9, "
        "before files were read to their stated size.",
        "",
    ]
    header = ["contender", "images", "samples/s", "/ its hand-written loop, per repeat", "verdict"]
    lines += ["| " + " | ".join([*header, MEASURED]) + " |", "|" + " --- |" * (len(header) + 1)]
    for name in ("loader-endtoend.json", "loader-endtoend-before-read-fix.json"):
        data = load(name)
        at = provenance(data, name)
        raw = data["end_to_end_raw"]
        for key, values in raw.items():
            folder, contender = key.split("|")
            images = "6,000" if folder == "small-6000" else "3,000"
            if contender in PAIRS:
                ratios = [a / b for a, b in zip(values, raw[f"{folder}|{PAIRS[contender]}"])]
                stats = data.get("end_to_end_ratios", {}).get(key) or ratios
                cells = [spread(stats, 2), verdict(stats)]
            else:
                cells = ["baseline", ""]
            rate = data.get("end_to_end", {}).get(key) or values
            lines.append("| " + " | ".join([contender, images, spread(rate), *cells, at]) + " |")
    return lines + [""]


def read_decode() -> list[str]:
    data = load("read_decode.json")
    at = provenance(data, "read_decode.json")
    rows = [[what, f"{us:.1f}"] for what, us in data["us_per_file"].items()]
    return [
        "### Reading and decoding one small JPEG (`benchmarks/read_decode.py`)",
        "",
        '300 JPEGs of 160x160, best of 7 passes, one thread; "before" read each file with `read(256 MiB + 1)`.',
        "",
    ] + table(["contender", "us a file"], rows, at)


def loader_startup() -> list[str]:
    data = load("loader.json")
    at = provenance(data, "loader.json")
    rows = []
    for key, run in data["startup"].items():
        files, which = key.split("|")
        rows.append([f"{int(files):,}", which, spread(run["first_step_s"], 1), spread(run["worker_uss_mb"])])
    return [
        "### Startup on large folders (`benchmarks/loader.py`)",
        "",
        'Folders of 8x8 PNGs in 100 classes, 2 loader workers; "before" is commit 0224ace, before the '
        "input-pipeline work (flat arrays, the manifest). Medians of 3 interleaved repeats.",
        "",
    ] + table(["files", "phalanx", "first step (s)", "loader worker USS (MB)"], rows, at)


def input_rate() -> list[str]:
    data = load("input_rate.json")
    at = provenance(data, "input_rate.json")
    names = {
        "loader": "loader.py's JPEGs, a `val/` folder",
        "other": "torchvision-encoded JPEGs (quality 80), a `val/` folder",
        "loader.py": "loader.py's own folder and flags",
    }
    rows = []
    for key, rate in data["rates"].items():
        folder, contender = key.split("|")
        ratio = data["ratios"].get(key)
        cells = (
            [spread(ratio, 2), verdict(ratio)]
            if ratio
            else (["baseline", ""] if contender.startswith("hand") else ["", ""])
        )
        rows.append([names.get(folder, folder), contender, spread(rate), *cells])
    lines = [
        "### Epoch 2's rate against a hand-written loop (`benchmarks/input_rate.py`)",
        "",
        "160x160 JPEGs in 10 class folders to 32 px, a model that costs nothing, `--augment none --num-workers 0 "
        "--batch-size 64`, `OMP_NUM_THREADS=1` unless a row says otherwise; phalanx's epoch 2 from "
        "`metrics.jsonl`, the loop's own epoch 2 (`read_file` + `decode_jpeg` + `v2.Resize((32, 32))` + "
        f"normalise). 7 interleaved repeats; the machine's load {data['load_range']}.",
        "",
    ]
    return lines + table(["data", "contender", "samples/s", "/ the hand-written loop, per repeat", "verdict"], rows, at)


def input_startup() -> list[str]:
    data = load("input_rate-startup.json")
    at = provenance(data, "input_rate-startup.json")
    rows = []
    for key, difference in data["startup_difference"].items():
        tree, manifest = key.split("|")
        tree = "4577de5" if tree == "this tree" else f"{tree} (before)"
        small, large = data["startup"][f"{key}|2000"], data["startup"][f"{key}|100000"]
        rows.append([tree, manifest, spread(small, 2), spread(large, 2), spread(difference, 2)])
    lines = [
        "### The first step with 100,000 files against 2,000 (`benchmarks/input_rate.py`)",
        "",
        "24-px JPEGs; seconds from process start to the end of the first optimizer step, 7 interleaved repeats, "
        "the difference taken per repeat; a cold manifest checks every file, a warm one only lists the folder. "
        f'"Before" is commit f612764, before the manifest\'s columns and JPEG header walk (4577de5); load {data["load_range"]}.',
        "",
    ]
    return lines + table(
        ["phalanx", "manifest", "2,000 files (s)", "100,000 files (s)", "100,000 - 2,000 (s)"], rows, at
    )


def recipes() -> list[str]:
    data = load("recipes.json")
    at = provenance(data, "recipes.json")
    pct = lambda s: spread(s, 1, 100, "%")  # noqa: E731
    lines = [
        "### Accuracy of the training recipes (`benchmarks/recipes.py`)",
        "",
        "The built-in digits at 32x32 with 359 training images (1,438 to validate on), smallcnn, 30 epochs, "
        "three seeds; validation accuracy, mean (min-max).",
        "",
    ]
    lines += table(["recipe", "validation accuracy"], [[k, pct(v)] for k, v in data["recipes"].items()], at)
    lines += ["Fine-tuning on the digits 5-9 with 20% of their images, from a model trained on the digits 0-4:", ""]
    return lines + table(
        ["digits 5-9, 20% to train on", "validation accuracy"], [[k, pct(v)] for k, v in data["finetune"].items()], at
    )


def float32() -> list[str]:
    data = load("float32.json")
    at = provenance(data, "float32.json")
    g = lambda v: f"{v:.2g}"  # noqa: E731
    rows = [
        [r["kernels"], r["run"], r["batch"], r["momentum"], r["schedule"], g(r["ddp"]), g(r["accum"]), g(r["threads"])]
        for r in data["rows"]
    ]
    return [
        "### float32: DDP against honest regroupings (`benchmarks/float32_rounding.py`)",
        "",
        "Largest weight difference from one process x 2B after the run, with ATen's kernels forced to each "
        "instruction set.",
        "",
    ] + table(
        [
            "kernels",
            "run",
            "B",
            "momentum",
            "schedule",
            "DDP 2xB vs 1x2B",
            "B x2 accumulated vs 2B",
            "2B, 1 thread vs 2B",
        ],
        rows,
        at,
    )


def deepliif() -> list[str]:
    data = load("deepliif.json")
    at = provenance(data, "deepliif.json")
    s = data["settings"]
    rows = [
        [
            name,
            spread(c["images_per_s"], 1),
            spread(data["ratios"][name], 3),
            "baseline" if name.startswith("DeepLIIF") else verdict(data["ratios"][name]),
            spread(c["training_only"], 1),
            spread(c["PSNR"], 2),
            spread(c["SSIM"], 3),
        ]
        for name, c in data["contenders"].items()
    ]
    lines = [
        "### `--task translate` against DeepLIIF's trainer (`benchmarks/deepliif.py`)",
        "",
        f"{s['epochs']} epochs of 800 pairs, {s['size']} px, batch {s['batch']}, ngf/ndf {s['ngf']}, "
        f"{s['repeats']} interleaved repeats; phalanx validating the last epoch only unless the row says so.",
        "",
    ]
    lines += table(
        [
            "contender",
            "images/s, epoch end to epoch end",
            "/ DeepLIIF, per repeat",
            "verdict",
            "images/s, training only",
            "val PSNR (dB)",
            "val SSIM",
        ],
        rows,
        at,
    )
    data = load("deepliif_model.json")
    at = provenance(data, "deepliif_model.json")
    s = data["settings"]
    rows = [
        [
            name,
            spread(c["images_per_s"], 2),
            spread(data["ratios"][name], 2),
            "baseline" if name.startswith("DeepLIIF") else verdict(data["ratios"][name]),
            spread(c["PSNR"], 2),
            spread(c["seg_PSNR"], 2),
            spread(c["count_error"], 2),
        ]
        for name, c in data["contenders"].items()
    ]
    lines += [
        "### `--task deepliif` against DeepLIIF's trainer on its own model (`benchmarks/deepliif_model.py`)",
        "",
        f"{s['epochs']} epochs of {s['train']} samples of 6 panels, {s['size']} px, batch {s['batch']}, "
        f"{s['repeats']} interleaved repeats. ({data['note']}.)",
        "",
    ]
    return lines + table(
        [
            "contender",
            "images/s, epoch end to epoch end",
            "/ DeepLIIF, per repeat",
            "verdict",
            "val PSNR, modalities (dB)",
            "val PSNR, segmentation (dB)",
            "cell count error",
        ],
        rows,
        at,
    )


SSL_SPEED = (
    "selfsupervised-speed.json",
    "selfsupervised-speed-recheck.json",
    "selfsupervised-speed-simclr-2026-11-27b.json",
    "selfsupervised-speed-dino-2026-11-27.json",
)


def selfsupervised_speed() -> list[str]:
    lines = [
        "### Self-supervised methods against Lightly (`benchmarks/selfsupervised.py --only speed`)",
        "",
        "Each method written with Lightly 1.6.0 as its examples write it, in a plain loop and a DDP loop, "
        "against phalanx `--task M`: smallcnn's backbone, the built-in digits as 32x32 RGB folders (718 to "
        "train, 360 to validate), batch 128 (2 x 64 under DDP), 2 epochs, one compute thread a process; "
        "samples/s of the second epoch, kNN accuracy after it, 7 interleaved repeats. The first file is "
        "the run of all eight; the others re-measured the methods they name.",
        "",
    ]
    header = [
        "world",
        "method",
        "Lightly samples/s",
        "phalanx samples/s",
        "phalanx / Lightly, per repeat",
        "verdict",
        "kNN Lightly",
        "kNN phalanx",
    ]
    lines += ["| " + " | ".join([*header, MEASURED]) + " |", "|" + " --- |" * (len(header) + 1)]
    for world, (lightly, ours) in (
        ("1 process", ("Lightly loop", "phalanx")),
        ("2 DDP workers", ("Lightly DDP loop, 2 workers", "phalanx DDP, 2 workers")),
    ):
        for name in SSL_SPEED:
            data = load(name)
            at = provenance(data, name)
            for method, runs in data["speed"].items():
                ratio = runs[ours]["ratio"]
                row = [
                    world,
                    method,
                    spread(runs[lightly]["samples_per_s"]),
                    spread(runs[ours]["samples_per_s"]),
                    spread(ratio, 2),
                    verdict(ratio),
                    f"{100 * runs[lightly]['knn_acc']['median']:.1f}%",
                    f"{100 * runs[ours]['knn_acc']['median']:.1f}%",
                    f"{at} ({name})",
                ]
                lines.append("| " + " | ".join(row) + " |")
    return lines + [""]


def selfsupervised_knn() -> list[str]:
    lines = [
        "### kNN accuracy over seeds (`benchmarks/selfsupervised.py --only knn --seeds 7`)",
        "",
        "One process, 2 epochs, seeds 0-6; phalanx minus Lightly on the same seed.",
        "",
    ]
    header = ["method", "Lightly loop", "phalanx", "phalanx - Lightly, same seed (points)", "verdict"]
    lines += ["| " + " | ".join([*header, MEASURED]) + " |", "|" + " --- |" * (len(header) + 1)]
    for name in ("selfsupervised-knn.json", "selfsupervised-knn-views.json"):
        data = load(name)
        at = provenance(data, name)
        for method, runs in data["knn"].items():
            lightly, ours = runs["Lightly loop"], runs["phalanx"]
            diffs = [100 * (a - b) for a, b in zip(ours["raw"], lightly["raw"])]
            text = f"{statistics.median(diffs):+.1f} ({min(diffs):+.1f} to {max(diffs):+.1f})"
            same = "parity" if min(diffs) < 0 < max(diffs) else "lead" if min(diffs) > 0 else "behind"
            lines.append(
                "| "
                + " | ".join(
                    [
                        method,
                        spread(lightly["summary"], 1, 100, "%"),
                        spread(ours["summary"], 1, 100, "%"),
                        text,
                        same,
                        at,
                    ]
                )
                + " |"
            )
    return lines + [""]


def selfsupervised_transfer() -> list[str]:
    lines = [
        "### A SimCLR backbone's transfer (`benchmarks/selfsupervised.py --only transfer`)",
        "",
        "The digits with 10% of the training split labelled (144 images), 16 px; a backbone pretrained by "
        "phalanx (20 epochs) and a random one, each as a linear probe and fine-tuned, 20 epochs, seeds 0-2; "
        "validation accuracy, median (min-max). The 2026-11-23 rows gave the SimCLR backbone's probes "
        "ImageNet's normalisation (fixed since).",
        "",
    ]
    rows, ats = [], []
    for name in ("selfsupervised-transfer.json", "selfsupervised.json"):
        data = load(name)
        at = provenance(data, name)
        for what, stats in data["transfer"].items():
            rows.append([what, spread(stats, 1, 100, "%")])
            ats.append(at)
    header = ["144 labelled images, 20 epochs", "validation accuracy"]
    lines += ["| " + " | ".join([*header, MEASURED]) + " |", "|" + " --- |" * (len(header) + 1)]
    lines += ["| " + " | ".join([*row, at]) + " |" for row, at in zip(rows, ats)] + [""]
    data = load("selfsupervised.json")
    at = provenance(data, "selfsupervised.json")
    rows = [
        [
            name,
            spread(run["samples_per_s"]),
            "baseline" if run["ratio"] is None else spread(run["ratio"], 2),
            "" if run["ratio"] is None else verdict(run["ratio"]),
            f"{100 * run['knn_acc']['median']:.1f}%",
        ]
        for name, run in data["speed"].items()
    ]
    lines += [
        "SimCLR alone, before the eight methods (10 epochs, all 1,437 images; Lightly's last batch dropped "
        "and its learning rate stepped per epoch then):",
        "",
    ]
    return lines + table(["contender", "samples/s", "/ Lightly, per repeat", "verdict", "kNN"], rows, at)


def views() -> list[str]:
    data = load("views.json")
    at = provenance(data, "views.json")
    rows = []
    for size, runs in data["ms"].items():
        lightly = next(v for k, v in runs.items() if k.startswith("Lightly"))
        rows.append(
            [
                f"{size} px",
                spread(lightly, 1),
                spread(runs["phalanx"], 1),
                spread(runs["ratio"], 2),
                verdict(runs["ratio"]),
            ]
        )
    return [
        "### Two views of a batch (`benchmarks/views.py`)",
        "",
        f"A batch of {data['batch']} images' two views, one thread, {data['repeats']} repeats; ms a batch; "
        "Lightly's SimCLRTransform one image at a time.",
        "",
    ] + table(
        ["size", "Lightly SimCLRTransform (ms)", "phalanx (ms)", "Lightly / phalanx, per repeat", "verdict"], rows, at
    )


def detect() -> list[str]:
    data = load("detect.json")
    at = provenance(data, "detect.json")
    reference, ours = data["raw"]["torchvision reference loop"], data["raw"]["phalanx --task detect"]
    rows = [
        ["torchvision reference loop", spread(reference, 2), "baseline", ""],
        ["phalanx --task detect", spread(ours, 2), spread(data["ratios"], 3), verdict(data["ratios"])],
    ]
    return [
        "### `--task detect` against torchvision's reference loop (`benchmarks/detect.py`)",
        "",
        "fasterrcnn_mobilenet_v3_large_320_fpn from scratch, 96 scenes of 64 px at 128 px, batch 4, 3 epochs, "
        "one compute thread; images/s over the epochs after the first, 7 interleaved repeats.",
        "",
    ] + table(["contender", "images/s", "/ reference, per repeat", "verdict"], rows, at)


def sharded() -> list[str]:
    data = load("sharded.json")
    at = provenance(data, "sharded.json")
    ddp_rate = statistics.median(r[1] for r in data["runs"]["ddp"])
    rows = [
        [
            name,
            spread([r[0] for r in runs]),
            spread([r[1] for r in runs], 2),
            f"{statistics.median(r[1] for r in runs) / ddp_rate:.2f}x",
        ]
        for name, runs in data["runs"].items()
    ]
    return [
        "### `--strategy fsdp` against DDP (`benchmarks/sharded.py`)",
        "",
        "2 CPU workers with gloo, 1 core each; a ViT-Base at 32 px in patches of 8 (85.8M weights), AdamW, "
        "2 images a worker a step, one epoch of 64 images with its checkpoint; 7 interleaved repeats; peak "
        "resident memory of the largest process.",
        "",
    ] + table(["strategy", "peak RSS, largest process (MiB)", "samples/s", "vs ddp"], rows, at)


def gpu() -> list[str]:
    lines = [
        "### On a GPU (`benchmarks/gpu.py`)",
        "",
        "resnet50 at 224 px, batch 128, channels-last, synthetic data in memory, 15 loader workers, every "
        'contender a fresh process, the order rotating each repeat. "no input pipeline": the hand-written '
        "loop's process, after its timed steps, the same steps on a batch already on the GPU. Where the "
        "device time allowed fewer than 7 repeats the row says how many.",
        "",
    ]
    header = [
        "setting",
        "contender",
        "images/s",
        "/ hand-written, same repeat",
        "verdict",
        "repeats",
        "peak GiB",
        "steps timed",
    ]
    lines += ["| " + " | ".join([*header, MEASURED]) + " |", "|" + " --- |" * (len(header) + 1)]
    for name in ("gpu.json", "gpu-fp32.json", "gpu-h200-a.json", "gpu-h200-b.json", "gpu-h100-2026-11-27.json"):
        data = load(name)
        at = provenance(data, name)
        options = data["options"]
        steps = f"{int(options['warmup']) + 1}-{options['steps']}"
        for setting, contenders in data["raw"].items():
            for contender, runs in contenders.items():
                rates = [r["images_per_s"] for r in runs]
                ratio = data["ratios"].get(f"{setting} {contender}")
                cells = ["baseline", ""] if ratio is None else [spread(ratio, 3), verdict(ratio)]
                peak = f"{statistics.median(r['peak_gib'] for r in runs):.2f}"
                lines.append(
                    "| "
                    + " | ".join(
                        [setting, contender, spread(rates), *cells, str(len(runs)), peak, steps, f"{at} ({name})"]
                    )
                    + " |"
                )
                if "compute_images_per_s" in runs[0]:
                    lines.append(
                        "| "
                        + " | ".join(
                            [
                                setting,
                                f"{contender}, no input pipeline",
                                spread([r["compute_images_per_s"] for r in runs]),
                                "",
                                "",
                                str(len(runs)),
                                "",
                                steps,
                                f"{at} ({name})",
                            ]
                        )
                        + " |"
                    )
    return lines + [""]


SECTIONS: list[tuple[str, list[Callable[[], list[str]]]]] = [
    ("Training loop", [training_loop, first_step, breakdown_cost, exit_latency, optimizer_step]),
    ("Input pipeline", [loader_throughput, loader_endtoend, input_rate, read_decode, loader_startup, input_startup]),
    ("Recipes and exactness", [recipes, float32]),
    (
        "Tasks against their peers",
        [deepliif, selfsupervised_speed, selfsupervised_knn, selfsupervised_transfer, views, detect],
    ),
    ("Sharded training", [sharded]),
    ("GPU", [gpu]),
]
USED = {
    "latest.json",
    "first_step.json",
    "breakdown_cost.json",
    "exit_latency.json",
    "optimizer_step.json",
    "loader-throughput-small.json",
    "loader-throughput-large.json",
    "loader.json",
    "loader-endtoend.json",
    "loader-endtoend-before-read-fix.json",
    "input_rate.json",
    "input_rate-startup.json",
    "read_decode.json",
    "recipes.json",
    "float32.json",
    "deepliif.json",
    "deepliif_model.json",
    *SSL_SPEED,
    "selfsupervised-knn.json",
    "selfsupervised-knn-views.json",
    "selfsupervised-transfer.json",
    "selfsupervised.json",
    "views.json",
    "detect.json",
    "sharded.json",
    "gpu.json",
    "gpu-fp32.json",
    "gpu-h200-a.json",
    "gpu-h200-b.json",
    "gpu-h100-2026-11-27.json",
}

HEAD = """# Benchmarks

<!-- Generated by benchmarks/tables.py from benchmarks/results/*.json: edit those, then run
     `.venv/bin/python benchmarks/tables.py`. tests/test_docs.py fails when this page is stale. -->

Every table here is generated from the result files in `benchmarks/results/` (each a `.json` with the
raw values, and a `.md` the benchmark wrote). Each row says when it was measured, at which commit
(the commit that recorded the result, unless the row names another checkout) and on what machine.
Medians with min-max over the repeats; a ratio is per repeat against the contender run next to it,
and is called a lead only when every repeat is above 1, parity when the range holds 1. What the
numbers mean, and what was changed because of them, is on the topic pages:
[training](training.md#speed), [the input pipeline](training.md#input-pipeline),
[translate](tasks/translate.md#beside-deepliifs-trainer), [deepliif](tasks/deepliif.md#beside-deepliifs-trainer),
[self-supervised](tasks/self-supervised.md#beside-lightly), [detect](tasks/detect.md#beside-torchvisions-reference-loop),
[sharded](sharded.md#measured), [the GPU machine](gpu.md#the-benchmark).

## Running them

```bash
bash scripts/setup.sh && .venv/bin/python benchmarks/run.py   # ~40 min on 2 cores, 26 with --no-lightning
.venv/bin/python benchmarks/loader.py                          # ~55 min: the input pipeline; --only, --sets
.venv/bin/python benchmarks/recipes.py                         # ~15 min: accuracy of the recipes
.venv/bin/python benchmarks/float32_rounding.py                # ~17 min: float32 DDP vs honest regroupings
.venv/bin/python benchmarks/deepliif.py                        # ~10 min: --task translate vs DeepLIIF
.venv/bin/python benchmarks/selfsupervised.py                  # ~65 min: 8 methods vs Lightly, and transfer
.venv/bin/python benchmarks/selfsupervised.py --only knn --seeds 7 --methods dino,moco   # ~12 min
.venv/bin/python benchmarks/detect.py                          # ~25 min: --task detect vs torchvision's loop
.venv/bin/python benchmarks/sharded.py                         # ~16 min: fsdp vs ddp (+ --depths, --activations)
.venv/bin/python benchmarks/first_step.py --profile            # ~9 min: when the first step ends, and the imports
.venv/bin/python benchmarks/exit_latency.py                    # ~4 min: how long a command takes to end
.venv/bin/python benchmarks/read_decode.py                     # ~1 min: reading and decoding one small JPEG
.venv/bin/python benchmarks/tables.py                          # this page, from the results
```

Each script makes its own data, installs its peer (Lightning, DeepLIIF, Lightly) into a separate
`benchmarks/.venv-*` sharing this torch build where the test environment lacks it, and writes
`benchmarks/results/<name>.{md,json}`. Run them one at a time on a quiet machine, then add the
`"provenance": {"date": ..., "commit": ..., "machine": ...}` block to the JSON and run this script.
Contenders are fresh processes, interleaved (A B C ... A B C ...) and repeated (7 times unless a row
says otherwise). Steady-state samples/s is measured after the warm-up steps (phalanx: from its own
`metrics.jsonl` windows, which include its logging); first step is from process start to the end of
the first optimizer step; wall time is the whole process (phalanx also validates and writes
checkpoints); peak RSS is the largest process.
"""


def render() -> str:
    lines = HEAD.splitlines() + [""]
    for title, parts in SECTIONS:
        lines += [f"## {title}", ""]
        for part in parts:
            lines += part()
    unknown = sorted(p.name for p in RESULTS.glob("*.json") if p.name not in USED)
    md_only = sorted(p.name for p in RESULTS.glob("*.md") if not p.with_suffix(".json").exists())
    lines += ["## Results without a table here", ""]
    if unknown:
        lines += ["Result files this page has no table for yet (add one to `benchmarks/tables.py`):", ""]
        lines += [f"- [`{name}`](../benchmarks/results/{name})" for name in unknown] + [""]
    lines += [
        "Written as Markdown only, without raw values (their figures are quoted, with their dates, on the "
        "topic pages):",
        "",
    ]
    lines += [f"- [`{name}`](../benchmarks/results/{name})" for name in md_only]
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str]) -> int:
    page = render()
    if argv[1:] == ["--check"]:
        if PAGE.exists() and PAGE.read_text() == page:
            return 0
        print(
            "docs/benchmarks.md is not what benchmarks/tables.py writes: run .venv/bin/python benchmarks/tables.py",
            file=sys.stderr,
        )
        return 1
    if argv[1:]:
        print("usage: benchmarks/tables.py [--check]", file=sys.stderr)
        return 2
    PAGE.parent.mkdir(exist_ok=True)
    PAGE.write_text(page)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
