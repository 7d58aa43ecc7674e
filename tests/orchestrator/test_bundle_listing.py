"""The suite's files listed for the bundle (one ``lstat`` a file, on strings) are, in the same order
with the same bytes and modes, what the plain listing gave: pathlib's checks file by file, kept here
as the reference. The same refusals too, with the same message, first one first."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent_runner.pins import is_cache_name
from bench.gen_suite import generate_suite
from orchestrator.errors import SuiteError
from orchestrator.hosts.bundle import _suite_entries

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "suites"


def _plain_entries(suite_dir: Path) -> list[tuple[str, bytes, bool]]:
    """The listing as it was: os.walk, then pathlib's is_symlink, is_file and lstat per file."""
    files: list[Path] = []
    for root, dirs, names in os.walk(suite_dir):
        dirs[:] = sorted(d for d in dirs if not is_cache_name(d))
        for d in dirs:
            if (Path(root) / d).is_symlink():
                raise SuiteError(f"{Path(root) / d}: symlinks are not shipped in a suite; copy the files in")
        for name in sorted(names):
            if is_cache_name(name):
                continue
            if name == "suite.toml" and Path(root) == suite_dir:
                continue
            p = Path(root) / name
            if p.is_symlink():
                raise SuiteError(f"{p}: symlinks are not shipped in a suite; copy the file in")
            if p.is_file() and p.lstat().st_nlink > 1:
                raise SuiteError(f"{p}: hard-linked files are not shipped in a suite; copy the file in")
            if p.is_file():
                files.append(p)
    ordered = sorted(files, key=lambda p: p.relative_to(suite_dir).as_posix())
    return [(p.relative_to(suite_dir).as_posix(), p.read_bytes(), os.access(p, os.X_OK)) for p in ordered]


def _outcome(listing: object, suite_dir: Path) -> object:
    try:
        return listing(suite_dir)  # type: ignore[operator]
    except SuiteError as exc:
        return f"SuiteError: {exc}"


def _odd_suite(root: Path) -> Path:
    """Caches skipped, suite.toml at the top (replaced) and below (shipped), executables, a FIFO
    (not shipped), names that sort differently as paths and as strings, empty directories."""
    (root / "tasks" / "a-b" / "repo").mkdir(parents=True)
    (root / "tasks" / "a" / "b").mkdir(parents=True)
    (root / "tasks" / "a.b").mkdir(parents=True)
    (root / "empty" / "deeper").mkdir(parents=True)
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "x.pyc").write_bytes(b"\0")
    (root / "suite.toml").write_text('name = "odd"\n')
    (root / "tasks" / "a" / "suite.toml").write_text("shipped below the top\n")
    (root / "tasks" / "a" / "b" / "x.txt").write_text("ab\n")
    (root / "tasks" / "a.b" / "y.txt").write_text("a.b\n")
    (root / "tasks" / "a-b" / "z.txt").write_text("a-b\n")
    run = root / "tasks" / "a-b" / "repo" / "run_tests.sh"
    run.write_text("exit 0\n")
    run.chmod(0o755)
    (root / "tasks" / "x.pyc").write_bytes(b"\1")
    (root / "ünï côde.md").write_text("name\n")
    os.mkfifo(root / "tasks" / "pipe")
    return root


def test_the_listing_is_the_plain_listing(tmp_path: Path) -> None:
    bench = tmp_path / "bench"
    generate_suite(bench, 30, 0, name="bench-t30-s0")
    for suite_dir in (EXAMPLES / "triage", EXAMPLES / "coin", bench, _odd_suite(tmp_path / "odd")):
        suite_dir = suite_dir.resolve()
        got = _suite_entries(suite_dir)
        assert got == _plain_entries(suite_dir), suite_dir
        assert got  # something is listed
    odd = [rel for rel, _, _ in _suite_entries((tmp_path / "odd").resolve())]
    assert "tasks/a/suite.toml" in odd and "suite.toml" not in odd and "tasks/pipe" not in odd
    assert not any("__pycache__" in rel or rel.endswith(".pyc") for rel in odd)


@pytest.mark.parametrize("planted", ["file-link", "dir-link", "hard-link", "two"])
def test_a_refused_file_is_refused_with_the_plain_message(tmp_path: Path, planted: str) -> None:
    suite_dir = _odd_suite(tmp_path / "s").resolve()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("not the suite's\n")
    if planted in ("file-link", "two"):
        (suite_dir / "tasks" / "a" / "b" / "link").symlink_to(outside / "secret")
    if planted in ("dir-link", "two"):
        (suite_dir / "tasks" / "a-b" / "linked").symlink_to(outside)
    if planted == "hard-link":
        os.link(outside / "secret", suite_dir / "tasks" / "a.b" / "hard")
    got = _outcome(_suite_entries, suite_dir)
    assert isinstance(got, str) and got.startswith("SuiteError: ")
    assert got == _outcome(_plain_entries, suite_dir)
