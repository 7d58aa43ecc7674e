"""Code, tests, tools and the README speak for themselves: none of them sends the reader to a design
document outside the repository, to an unnamed predecessor or to a tracker's issue number (the
reference is docs/)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLACES = ["orchestrator", "agent_runner", "tests", "bench", "tools", "README.md", "Makefile"]
# Character classes keep this file from matching itself.
OUTSIDE = re.compile(r"D[E]SIGN|\bthe s[e]ed\b|s[e]ed's|s[e]ed format|issu[e] [0-9]")
SUFFIXES = {".py", ".md", ".toml", ".json", ".sh", ".txt", ".cfg", ""}


def _files() -> list[Path]:
    out: list[Path] = []
    for place in PLACES:
        path = REPO / place
        if path.is_file():
            out.append(path)
        elif path.is_dir():
            out += [
                p for p in sorted(path.rglob("*"))
                if p.is_file() and p.suffix in SUFFIXES and "__pycache__" not in p.parts
                and "results" not in p.relative_to(REPO).parts
            ]
    return out


def test_nothing_refers_outside_the_repository() -> None:
    hits = []
    for path in _files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            if OUTSIDE.search(line):
                hits.append(f"{path.relative_to(REPO)}:{number}: {line.strip()[:100]}")
    assert not hits, "say the actual thing (or name a docs/ page) instead:\n" + "\n".join(hits)
