"""The README and docs/ link only to files and headings that exist in the repository, so a reader who
follows a link lands on the page (and the section) it promises; and they show no path of the machine
they were written on (real output is pasted in with its paths generalised)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, markup and punctuation dropped, spaces to '-'."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} +(.+?) *$", text, re.M)}


def _links(page: Path) -> list[str]:
    return _LINK.findall(_FENCE.sub("", page.read_text(encoding="utf-8")))


def test_the_readme_links_the_reference() -> None:
    assert "docs/README.md" in _links(REPO / "README.md")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken: list[str] = []
    for target in _links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_path_of_the_writers_machine(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    home = str(Path.home()).rstrip("/")
    machine = [str(REPO) + "/"] + ([home + "/"] if home else [])
    found = sorted({m for m in machine if m in text})
    # /work/ as a path's root is this machine's; inside a path (a workspace's .../work/) it is crosshost's
    found += ["/work/"] if re.search(r"(^|[\s\"'`(=])/work/", text, re.M) else []
    assert not found, f"{page.relative_to(REPO)} shows {found}: write ~/..., a placeholder, or a relative path"
