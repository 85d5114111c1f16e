"""The runs ``visualize`` shows: each --pickle-dir is one run (local or S3), or a folder of runs.

A local folder that does not exist yet, or is still empty, is waited for (DeepLIIF's guide starts
the visualizer before training creates ``<run>/pickle``) and told apart once it has content: a run
(it holds segments) or a folder of runs (its subfolders do). ``--once`` does not wait.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import PhalanxError
from ..records.snapshots import History
from .sources import LocalSource, SnapshotSource, open_source, run_dirs

if TYPE_CHECKING:
    from .options import VisualizeOptions


def checked_folder(given: str, once: bool) -> Path:
    """A local --pickle-dir: a folder, or (without --once) a path that may become one."""
    path = Path(given)
    if path.exists() and not path.is_dir():
        raise PhalanxError(
            f"{path} is a file, not a folder of snapshots; give a run's pickle folder "
            "(<checkpoints-dir>/<name>/pickle) or a folder of runs",
            "--pickle-dir",
        )
    if once and not path.exists():
        LocalSource(path)  # says it does not exist, and who creates it
    return path


class Runs:
    """Looked through again at every poll, so a run (or a folder) that appears later is picked up."""

    def __init__(self, opts: VisualizeOptions):
        self.opts = opts
        self.sources: dict[str, SnapshotSource] = {}
        self.folders: list[Path] = []
        self.pending: list[Path] = []  # local folders not yet told apart: missing or empty
        self.waiting_said: set[Path] = set()
        for given in opts.pickle_dir:
            if given.startswith("s3://"):
                self.sources[given] = open_source(given, opts.s3_endpoint_url)
            else:
                self.pending.append(checked_folder(given, opts.once))
        self.find_new()

    def _sort_pending(self) -> None:
        for path in list(self.pending):
            if not path.is_dir():
                if not self.opts.once and path not in self.waiting_said:
                    self.waiting_said.add(path)
                    print(f"phalanx: waiting for {path} to appear", flush=True)
                continue
            source = LocalSource(path)
            if source.has_segments():
                self.sources[str(path)] = source
            elif run_dirs(path):
                self.folders.append(path)
            else:
                continue  # still empty
            self.pending.remove(path)

    def find_new(self) -> None:
        self._sort_pending()
        for folder in self.folders:
            for run in run_dirs(folder):
                if str(run) not in self.sources:
                    self.sources[str(run)] = LocalSource(run)
                    self.sources[str(run)].label = f"{run}/"

    def missing(self) -> list[Path]:
        return [path for path in self.pending if not path.exists()]

    @property
    def comparing(self) -> bool:
        return len(self.opts.pickle_dir) > 1 or bool(self.folders)

    def histories(self, warn: bool) -> dict[str, History]:
        self.find_new()
        found = {}
        for key, source in self.sources.items():
            history = source.history(warn)
            if history is not None:
                found[key] = history
        return found

    def warn_problems(self) -> None:
        for source in self.sources.values():
            source.warn_problems()

    def problems(self) -> str:
        return "; ".join(f"{n}: {w}" for s in self.sources.values() for n, w in sorted(s.problems.items())[:3])
