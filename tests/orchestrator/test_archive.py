"""A pulled archive is read member by member; anything unsafe is refused before a byte is written."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from orchestrator.errors import ArchiveRejected
from orchestrator.hosts.archive import ArchiveLimits, read_archive


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return path


def _file(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


def _all_files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() or p.is_symlink()}


def test_regular_files_are_written_under_dest(tmp_path: Path) -> None:
    d = tarfile.TarInfo("./traces")
    d.type = tarfile.DIRTYPE
    arc = _tar(
        tmp_path / "out.tar",
        [(d, None), _file("./fingerprint.json", b"{}"), _file("./traces/t.0.jsonl", b'{"type":"header"}\n')],
    )
    dest = tmp_path / "run" / "hosts" / "box-b"
    written = read_archive(arc, dest, host="box-b")
    assert sorted(map(str, written)) == ["fingerprint.json", "traces/t.0.jsonl"]
    assert (dest / "traces" / "t.0.jsonl").read_bytes() == b'{"type":"header"}\n'


@pytest.mark.parametrize("bad", ["../x", "traces/../../x", "/etc/evil", "a/../../x"])
def test_escaping_names_are_refused_and_nothing_is_written(tmp_path: Path, bad: str) -> None:
    # A safe member comes first: it must not be written either.
    arc = _tar(tmp_path / "out.tar", [_file("ok.json"), _file(bad, b"pwned")])
    dest = tmp_path / "run" / "hosts" / "h"
    with pytest.raises(ArchiveRejected, match="unsafe name") as info:
        read_archive(arc, dest, host="h")
    assert info.value.host == "h"
    assert _all_files(tmp_path) == {"out.tar"}


@pytest.mark.parametrize("kind", [tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE, tarfile.FIFOTYPE])
def test_links_and_devices_are_refused(tmp_path: Path, kind: bytes) -> None:
    link = tarfile.TarInfo("traces/t.0.jsonl")
    link.type = kind
    link.linkname = "/etc/passwd"
    arc = _tar(tmp_path / "out.tar", [_file("a.json"), (link, None)])
    with pytest.raises(ArchiveRejected, match="only regular files"):
        read_archive(arc, tmp_path / "dest", host="h")
    assert _all_files(tmp_path) == {"out.tar"}


def test_symlink_then_file_through_it_is_refused(tmp_path: Path) -> None:
    # The classic two-step escape: a link named d -> /tmp/outside, then d/x.
    outside = tmp_path / "outside"
    outside.mkdir()
    link = tarfile.TarInfo("d")
    link.type = tarfile.SYMTYPE
    link.linkname = str(outside)
    arc = _tar(tmp_path / "out.tar", [(link, None), _file("d/x", b"pwned")])
    with pytest.raises(ArchiveRejected):
        read_archive(arc, tmp_path / "dest", host="h")
    assert list(outside.iterdir()) == []


def test_too_many_members(tmp_path: Path) -> None:
    arc = _tar(tmp_path / "out.tar", [_file(f"f{i}") for i in range(6)])
    with pytest.raises(ArchiveRejected, match="more than 5 members"):
        read_archive(arc, tmp_path / "dest", host="h", limits=ArchiveLimits(max_members=5))
    assert not (tmp_path / "dest").exists()


def test_too_many_bytes(tmp_path: Path) -> None:
    arc = _tar(tmp_path / "out.tar", [_file("a", b"x" * 600), _file("b", b"y" * 600)])
    with pytest.raises(ArchiveRejected, match="more than 1000 bytes"):
        read_archive(arc, tmp_path / "dest", host="h", limits=ArchiveLimits(max_total_bytes=1000))
    assert not (tmp_path / "dest").exists()


def test_duplicate_member_is_refused(tmp_path: Path) -> None:
    arc = _tar(tmp_path / "out.tar", [_file("a", b"1"), _file("./a", b"2")])
    with pytest.raises(ArchiveRejected, match="twice"):
        read_archive(arc, tmp_path / "dest", host="h")


def test_garbage_is_refused(tmp_path: Path) -> None:
    arc = tmp_path / "out.tar"
    arc.write_bytes(b"this is not a tar archive at all" * 40)
    with pytest.raises(ArchiveRejected, match="out.tar"):
        read_archive(arc, tmp_path / "dest", host="h")


def test_existing_link_in_dest_is_not_written_through(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "traces").symlink_to(outside)
    arc = _tar(tmp_path / "out.tar", [_file("traces/t.0.jsonl", b"pwned")])
    with pytest.raises(ArchiveRejected, match="outside"):
        read_archive(arc, dest, host="h")
    assert list(outside.iterdir()) == []


def _plain_extract(arc: Path, dest: Path) -> set[tuple[str, bytes]]:
    """What the archive holds, written the plain way (every member's directory resolved and made on
    its own): the reference the archive reader, which looks at each directory once, must match."""
    dest.mkdir(parents=True)
    root = dest.resolve()
    with tarfile.open(arc) as tar:
        for member in tar:
            if member.isreg():
                target = root.joinpath(*[p for p in member.name.split("/") if p not in ("", ".")])
                assert target.parent.resolve().is_relative_to(root)
                target.parent.mkdir(parents=True, exist_ok=True)
                src = tar.extractfile(member)
                assert src is not None
                target.write_bytes(src.read())
    return {(str(p.relative_to(dest)), p.read_bytes()) for p in dest.rglob("*") if p.is_file()}


def test_a_host_output_shaped_archive_is_written_as_the_plain_way_writes_it(tmp_path: Path) -> None:
    d = tarfile.TarInfo("./traces")
    d.type = tarfile.DIRTYPE
    members: list[tuple[tarfile.TarInfo, bytes | None]] = [(d, None), _file("./fingerprint.json", b"{}")]
    for i in range(60):  # members of one directory interleaved with others', as a runner's out/ holds them
        members.append(_file(f"./traces/t{i:03d}.0.jsonl", f"trace {i}\n".encode()))
        members.append(_file(f"./traces/t{i:03d}.0.obs.jsonl", b""))
        if i % 7 == 0:
            members.append(_file(f"./files/t{i:03d}/deep/er/evidence.json", f"[{i}]".encode()))
    members.append(_file("./results.jsonl", b'{"task": "t000"}\n'))
    arc = _tar(tmp_path / "out.tar", members)
    dest = tmp_path / "run" / "hosts" / "box-b"
    written = read_archive(arc, dest, host="box-b")
    got = {(str(p.relative_to(dest)), p.read_bytes()) for p in dest.rglob("*") if p.is_file()}
    assert got == _plain_extract(arc, tmp_path / "plain")
    assert sorted(map(str, written)) == sorted(name for name, _ in got)


def test_a_link_planted_in_a_second_directory_is_refused_after_the_first_was_written(tmp_path: Path) -> None:
    """Directories are checked once each: a later member's other directory is still checked."""
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "dest"
    (dest / "a").mkdir(parents=True)
    (dest / "b").symlink_to(outside)
    arc = _tar(tmp_path / "out.tar", [_file("a/1.jsonl"), _file("a/2.jsonl"), _file("b/3.jsonl", b"pwned")])
    with pytest.raises(ArchiveRejected, match="outside"):
        read_archive(arc, dest, host="h")
    assert list(outside.iterdir()) == []
    assert list((dest / "a").iterdir()) == []  # half an archive is taken back


def _stream(*frames: tuple[str, bytes]) -> bytes:
    return b"".join(f"{name} {len(data)}\n".encode() + data for name, data in frames)


def test_a_trace_stream_is_written_as_the_files_it_holds(tmp_path: Path) -> None:
    # 40 files interleaved: more than are kept open at once, so some are opened again to append
    parts = [(f"traces/t{i:02d}.0.jsonl", f"line {j} of {i}\n".encode()) for j in range(3) for i in range(40)]
    arc = _tar(tmp_path / "out.tar", [_file("./results.jsonl", b"{}\n"), _file("./traces.stream", _stream(*parts))])
    dest = tmp_path / "run" / "hosts" / "h"
    sha256s: dict = {}
    written = read_archive(arc, dest, host="h", sha256s=sha256s)
    want = {f"traces/t{i:02d}.0.jsonl": "".join(f"line {j} of {i}\n" for j in range(3)).encode() for i in range(40)}
    assert _all_files(dest) == {"results.jsonl", *want}  # the stream itself is not kept
    assert {k: (dest / k).read_bytes() for k in want} == want
    assert sorted(map(str, written)) == sorted(["results.jsonl", *want])
    assert {str(k): v for k, v in sha256s.items() if str(k) != "results.jsonl"} == {
        k: hashlib.sha256(v).hexdigest() for k, v in want.items()}


@pytest.mark.parametrize("order", ["stream first", "member first"])
def test_a_stream_file_the_archive_also_holds_is_refused_and_nothing_is_written(tmp_path: Path, order: str) -> None:
    # an attempt with the runner's uid (no isolation) adds a file of its own beside the stream's
    stream = _file("./traces.stream", _stream(("traces/t.0.jsonl", b"the runner's\n")))
    forged = _file("./traces/t.0.jsonl", b"forged\n")
    arc = _tar(tmp_path / "out.tar", [_file("./results.jsonl"), *([stream, forged] if order == "stream first" else [forged, stream])])
    with pytest.raises(ArchiveRejected, match="appears twice|cannot read or unpack"):
        read_archive(arc, tmp_path / "dest", host="h")
    assert _all_files(tmp_path) == {"out.tar"}


@pytest.mark.parametrize("name", ["../x", "traces/../../x", "fingerprint.json", "traces/sub/x", "/etc/x"])
def test_a_stream_frame_named_outside_traces_is_refused_and_nothing_is_written(tmp_path: Path, name: str) -> None:
    data = _stream(("traces/ok.0.jsonl", b"ok\n")) + f"{name} 5\n".encode() + b"pwned"
    arc = _tar(tmp_path / "out.tar", [_file("./results.jsonl"), _file("./traces.stream", data)])
    with pytest.raises(ArchiveRejected, match="traces.stream"):
        read_archive(arc, tmp_path / "dest", host="h")
    assert _all_files(tmp_path) == {"out.tar"}


def test_a_stream_of_more_files_than_an_archive_may_hold_is_refused(tmp_path: Path) -> None:
    data = _stream(*[(f"traces/t{i}.0.jsonl", b"x") for i in range(6)])
    arc = _tar(tmp_path / "out.tar", [_file("./results.jsonl"), _file("./traces.stream", data)])
    with pytest.raises(ArchiveRejected, match="more files"):
        read_archive(arc, tmp_path / "dest", host="h", limits=ArchiveLimits(max_members=5))
    assert _all_files(tmp_path) == {"out.tar"}


def test_a_stream_of_empty_frames_costs_what_tar_headers_cost(tmp_path: Path) -> None:
    # each frame is charged like a member's header: a flood of empty frames stops at the content cap
    data = b"traces/t.0.jsonl 0\n" * 3000
    arc = _tar(tmp_path / "out.tar", [_file("./traces.stream", data)])
    with pytest.raises(ArchiveRejected, match="frames"):
        read_archive(arc, tmp_path / "dest", host="h", limits=ArchiveLimits(max_total_bytes=1_000_000))
    assert _all_files(tmp_path) == {"out.tar"}
    assert read_archive(arc, tmp_path / "ok", host="h", limits=ArchiveLimits(max_total_bytes=2_000_000))


def test_a_stream_header_that_is_not_one_refuses_the_archive_and_a_cut_one_keeps_what_came(tmp_path: Path) -> None:
    good = _stream(("traces/a.0.jsonl", b"one\n"), ("traces/b.0.jsonl", b"two\n"))
    bad = _tar(tmp_path / "bad.tar", [_file("./results.jsonl"), _file("./traces.stream", good + b"not a header\n")])
    with pytest.raises(ArchiveRejected, match="not a frame's header"):
        read_archive(bad, tmp_path / "dest", host="h")
    assert not (tmp_path / "dest").exists() or _all_files(tmp_path / "dest") == set()
    cut = _tar(tmp_path / "cut.tar", [_file("./traces.stream", good + b"traces/c.0.jsonl 10\nthr")])
    read_archive(cut, tmp_path / "home", host="h")
    assert (tmp_path / "home" / "traces" / "c.0.jsonl").read_bytes() == b"thr"  # a runner killed mid-frame
    assert (tmp_path / "home" / "traces" / "b.0.jsonl").read_bytes() == b"two\n"


@pytest.mark.parametrize("planted", ["file", "link"])
def test_a_stream_file_is_never_written_through_what_is_already_there(tmp_path: Path, planted: str) -> None:
    dest = tmp_path / "dest"
    (dest / "traces").mkdir(parents=True)
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"keep")
    if planted == "file":
        (dest / "traces" / "a.0.jsonl").write_bytes(b"keep")
    else:
        (dest / "traces" / "a.0.jsonl").symlink_to(outside)
    arc = _tar(tmp_path / "out.tar", [_file("./traces.stream", _stream(("traces/a.0.jsonl", b"pwned")))])
    with pytest.raises(ArchiveRejected):
        read_archive(arc, dest, host="h")
    assert outside.read_bytes() == b"keep"
    planted_path = dest / "traces" / "a.0.jsonl"
    assert planted_path.is_symlink() if planted == "link" else planted_path.read_bytes() == b"keep"
