"""Archives a hostile or broken host could send: refused, and nothing of them is left in the run dir."""

from __future__ import annotations

import gzip
import io
import tarfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from orchestrator.errors import ArchiveRejected
from orchestrator.hosts.archive import ArchiveLimits, read_archive


def _tar(path: Path, members: list[tuple[str, bytes]], **kwargs: object) -> Path:
    with tarfile.open(path, "w", **kwargs) as tar:  # type: ignore[call-overload]
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


Reader = Callable[..., list[PurePosixPath]]


@pytest.fixture(params=["from a file", "from memory"])
def read(request: pytest.FixtureRequest) -> Reader:
    """``read_archive`` of a fetched archive (a file) and of one that came in the run's output (its
    bytes in memory): every refusal is the same both ways."""
    if request.param == "from a file":
        return read_archive

    def from_memory(archive: Path, dest: Path, **kwargs: Any) -> list[PurePosixPath]:
        return read_archive(Path(archive.name), dest, data=archive.read_bytes(), **kwargs)

    return from_memory


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir()} if root.exists() else set()


def test_a_file_that_is_also_a_directory_is_refused_before_writing(read: Reader, tmp_path: Path) -> None:
    archive = _tar(tmp_path / "a.tar", [("traces/x.jsonl", b"1"), ("traces", b"2"), ("results.jsonl", b"3")])
    archive2 = _tar(tmp_path / "b.tar", [("results.jsonl", b"3"), ("traces", b"2"), ("traces/x.jsonl", b"1")])
    for path in (archive, archive2):
        dest = tmp_path / f"out-{path.stem}"
        with pytest.raises(ArchiveRejected, match="both a file and a directory"):
            read(path, dest, host="h")
        assert _files(dest) == set()


def test_a_regular_file_named_like_the_root_is_refused(read: Reader, tmp_path: Path) -> None:
    archive = _tar(tmp_path / "a.tar", [("results.jsonl", b"1"), ("./", b"x")])
    with pytest.raises(ArchiveRejected):
        read(archive, tmp_path / "out", host="h")
    assert _files(tmp_path / "out") == set()


def test_a_failure_while_writing_leaves_no_partial_files(read: Reader, tmp_path: Path) -> None:
    archive = _tar(tmp_path / "a.tar", [("results.jsonl", b"ok"), ("traces/t.0.jsonl", b"x")])
    dest = tmp_path / "out"
    (dest / "traces").mkdir(parents=True)
    (dest / "traces" / "t.0.jsonl").write_text("already here")  # O_EXCL refuses to overwrite it
    with pytest.raises(ArchiveRejected):
        read(archive, dest, host="h")
    assert _files(dest) == {"traces/t.0.jsonl"}
    assert (dest / "traces" / "t.0.jsonl").read_text() == "already here"


def test_a_compressed_archive_is_refused(read: Reader, tmp_path: Path) -> None:
    """The host's tar is plain (`tar -cf`); a gzip stream could hide a decompression bomb."""
    plain = _tar(tmp_path / "p.tar", [("results.jsonl", b"x")])
    gz = tmp_path / "a.tar.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    with pytest.raises(ArchiveRejected):
        read(gz, tmp_path / "out", host="h")
    assert _files(tmp_path / "out") == set()


def test_an_archive_file_larger_than_the_caps_allow_is_refused_before_parsing(read: Reader, tmp_path: Path) -> None:
    # 10 bytes of content allowed, but a 1 MB pax header (read into memory by tarfile) is sent.
    path = tmp_path / "big.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("results.jsonl")
        info.pax_headers = {"comment": "x" * 1_000_000}
        info.size = 1
        tar.addfile(info, io.BytesIO(b"1"))
    with pytest.raises(ArchiveRejected, match="bytes"):
        read(
            path, tmp_path / "out", host="h", limits=ArchiveLimits(max_members=10, max_total_bytes=10)
        )
    assert _files(tmp_path / "out") == set()


@pytest.mark.parametrize("name", ["hosts/../x", "a/../../x", "..", "/etc/x", "a\\..\\x"])
def test_escaping_names_write_nothing_anywhere(read: Reader, tmp_path: Path, name: str) -> None:
    run = tmp_path / "run"
    dest = run / "hosts" / "h"
    info = tarfile.TarInfo(name)
    info.size = 1
    path = tmp_path / "a.tar"
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        tar.addfile(info, io.BytesIO(b"1"))
    with pytest.raises(ArchiveRejected):
        read(path, dest, host="h")
    assert _files(tmp_path) == {"a.tar"}


def test_an_archive_in_memory_writes_what_the_same_file_writes(tmp_path: Path) -> None:
    members = [("fingerprint.json", b"{}"), ("traces/t.0.jsonl", bytes(range(256)) * 300), ("results.jsonl", b"")]
    archive = _tar(tmp_path / "a.tar", members)
    digests: dict[str, dict[PurePosixPath, str]] = {"file": {}, "memory": {}}
    read_archive(archive, tmp_path / "file", host="h", sha256s=digests["file"])
    read_archive(Path("a.tar"), tmp_path / "memory", host="h", sha256s=digests["memory"], data=archive.read_bytes())
    assert _files(tmp_path / "memory") == _files(tmp_path / "file") == {name for name, _ in members}
    for name, data in members:
        assert (tmp_path / "memory" / name).read_bytes() == data
    assert digests["memory"] == digests["file"] and len(digests["file"]) == 3
