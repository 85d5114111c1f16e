"""The documentation holds: every relative link and #anchor in README.md and docs/ resolves, every
code block a page marks as runnable (`<!-- runnable -->` on the line before its fence) runs, the
README stays short and runs CI's test command, no page counts work periods, and docs/benchmarks.md
is what benchmarks/tables.py writes from benchmarks/results/."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
RUNNABLE = "<!-- runnable -->"
LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The page without its fenced code blocks and inline code (links there are not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "``", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but hyphens and underscores dropped,
    spaces made hyphens."""
    text = re.sub(r"`", "", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M).splitlines():
        match = re.match(r"^#{1,6} (.+?)\s*#*\s*$", line)
        if match:
            base = slug(match.group(1))
            count = seen.get(base, 0)
            found.add(base if count == 0 else f"{base}-{count}")
            seen[base] = count + 1
    return found


def links(page: Path) -> list[str]:
    return [a or b for a, b in LINK.findall(prose(page.read_text()))]


def test_the_slug_is_githubs():
    assert slug("`phalanx train`: DistributedDataParallel") == "phalanx-train-distributeddataparallel"
    assert (
        slug("Image-to-image translation: `--task translate` (pix2pix, DeepLIIF)")
        == "image-to-image-translation---task-translate-pix2pix-deepliif"
    )
    assert slug("DINO's default head on the built-in digits") == "dinos-default-head-on-the-built-in-digits"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(page):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no file {file}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading in {file.relative_to(REPO)} has the anchor #{anchor}")
    assert not broken, f"{page.relative_to(REPO)}:\n" + "\n".join(broken)


def runnable_blocks() -> list[tuple[str, str]]:
    blocks = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        for index, line in enumerate(lines):
            if line.strip() == RUNNABLE:
                fence = lines[index + 1]
                assert fence.startswith("```"), f"{page}: {RUNNABLE} is not right before a code fence"
                end = next(i for i in range(index + 2, len(lines)) if lines[i].startswith("```"))
                blocks.append((f"{page.relative_to(REPO)}:{index + 2}", "\n".join(lines[index + 2 : end])))
    return blocks


def test_pages_mark_blocks_to_run():
    assert len(runnable_blocks()) >= 3


@pytest.mark.parametrize("where,script", runnable_blocks(), ids=[w for w, _ in runnable_blocks()])
def test_a_runnable_block_runs(where, script, tmp_path):
    # In an empty folder, with the venv's console scripts first on PATH, as a user who activated it.
    bin_dir = Path(sys.executable).parent
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PHALANX_REPO": str(REPO),
        "PYTHONUNBUFFERED": "1",
    }
    done = subprocess.run(
        ["bash", "-e", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, (
        f"{where} exited {done.returncode}:\n{script}\n--- stdout\n{done.stdout[-3000:]}"
        f"\n--- stderr\n{done.stderr[-3000:]}"
    )


def test_the_readme_is_short_and_writes_what_ci_runs():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    ci = (REPO / ".ci" / "run").read_text()
    for command in (
        "bash scripts/setup.sh && .venv/bin/phalanx train",
        "bash scripts/setup.sh --test && .venv/bin/python -m pytest",
    ):
        assert f"```bash\n{command}\n```" in readme and f"\n{command}\n" in ci, command


# Work periods counted or narrated ("the fourth GPU session", "this round"): a page says what was
# measured, when, on what, at which commit.
NARRATION = re.compile(
    r"\b(sessions?|this round|round \d|earlier that (evening|day|morning)|"
    r"(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
    r"thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|"
    r"twenty-\w+) (gpu )?(session|round|period))\b",
    re.I,
)


def test_no_page_counts_work_periods():
    found = [
        f"{page.relative_to(REPO)}: {m.group(0)!r}"
        for page in PAGES
        for m in NARRATION.finditer(re.sub(r"test session|session's own|pytest session", "", page.read_text()))
    ]
    assert not found, found


def test_benchmarks_page_is_what_the_script_writes():
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "tables.py"), "--check"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def test_benchmark_tables_say_when_on_what_and_at_which_commit():
    import json

    for path in sorted((REPO / "benchmarks" / "results").glob("*.json")):
        found = json.loads(path.read_text()).get("provenance", {})
        assert all(found.get(key) for key in ("date", "commit", "machine")), path.name
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", found["date"]) and re.fullmatch(r"[0-9a-f]{7,40}", found["commit"]), (
            path.name
        )


def test_the_benchmarks_script_is_deterministic():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import tables
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    assert tables.render() == tables.render()
