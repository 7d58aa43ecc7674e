"""Reading a tar archive a host sent back, without trusting it.

A host is not trusted to name files: ``extractall`` would follow ``../x``, absolute names, symlinks and
device nodes wherever they point. Here every member is checked first (regular files and directories
with safe relative names only, count and total size capped); only when the whole archive passes is
anything written, member by member through ``extractfile``, under the destination directory. A
runner's trace stream (``agent_runner/trace_stream.py``) is written as the files it holds, each checked
as a member of its own would be, never as itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from agent_runner.trace_stream import STREAM, StreamError, frames
from orchestrator.errors import ArchiveRejected

MAX_MEMBERS = 20_000
MAX_TOTAL_BYTES = 512 * 1024 * 1024
_CHUNK = 1024 * 1024
#: tar's own bytes per member (header, long-name blocks, padding) on top of the content; beyond this the
#: file holds something else (e.g. a huge pax header, which tarfile reads into memory)
_OVERHEAD_PER_MEMBER = 4096
_STREAM = PurePosixPath(STREAM)
#: the files of a trace stream kept open at once while it is split: two a slot's attempt; the one used
#: longest ago is closed for a new one, and opened again to append when its next frame comes
_STREAM_OPEN_MAX = 64
#: what each frame of a stream costs of the archive's content budget beside its bytes, as a file's tar
#: header did: a stream of empty frames cannot keep the controller splitting for minutes
_FRAME_COST = 512


@dataclass(frozen=True)
class ArchiveLimits:
    max_members: int = MAX_MEMBERS
    max_total_bytes: int = MAX_TOTAL_BYTES


def max_archive_bytes(limits: ArchiveLimits | None = None) -> int:
    """The largest archive file accepted: the content cap plus tar's own bytes for every member."""
    limits = limits or ArchiveLimits()
    return limits.max_total_bytes + (limits.max_members + 3) * _OVERHEAD_PER_MEMBER


def safe_member_name(name: str) -> PurePosixPath | None:
    """The member's relative path, or None when the name could escape the destination.

    ``./`` prefixes (``tar -C out -cf - .``) are dropped; the archive root itself maps to ``.``.
    """
    if not name or "\x00" in name or "\\" in name or name.startswith("/"):
        return None
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        return None
    return PurePosixPath(*parts) if parts else PurePosixPath(".")


def _check(members: list[tarfile.TarInfo], host: str, source: str, limits: ArchiveLimits) -> None:
    total = 0
    seen: set[PurePosixPath] = set()
    dirs: set[PurePosixPath] = set()
    for member in members:
        where = f"{source}: member {member.name!r}"
        rel = safe_member_name(member.name)
        if rel is None:
            raise ArchiveRejected(host, f"{where} has an unsafe name (absolute or '..'); nothing was written")
        dirs.update(rel.parents)
        if member.isdir():
            dirs.add(rel)
        elif rel == PurePosixPath("."):
            raise ArchiveRejected(host, f"{where} is a file named like the archive root; nothing was written")
        if not (member.isreg() or member.isdir()):
            kind = "link" if (member.issym() or member.islnk()) else "device/fifo/special file"
            raise ArchiveRejected(host, f"{where} is a {kind}; only regular files are accepted; nothing was written")
        if member.isreg():
            if rel in seen:
                raise ArchiveRejected(host, f"{where} appears twice; nothing was written")
            seen.add(rel)
            total += member.size
            if total > limits.max_total_bytes:
                raise ArchiveRejected(
                    host, f"{source}: more than {limits.max_total_bytes} bytes of content; nothing was written"
                )
    clash = sorted(str(p) for p in seen & dirs)
    if clash:
        # Writing would stop half-way (a file where a directory must go): refuse before writing.
        raise ArchiveRejected(host, f"{source}: {clash[0]!r} is both a file and a directory; nothing was written")


def read_archive(
    archive: Path,
    dest: Path,
    *,
    host: str,
    limits: ArchiveLimits | None = None,
    sha256s: dict[PurePosixPath, str] | None = None,
    data: bytes | None = None,
) -> list[PurePosixPath]:
    """Check every member of ``archive``, then write its regular files under ``dest``.

    Returns the relative paths written; ``sha256s`` (when given) gets each one's sha256, of the bytes
    as they were written (what reading the file back would give: nothing else writes there). Raises
    ``ArchiveRejected`` (nothing written) when any member is unsafe, when there are too many members
    or too many bytes, or when the file is not a tar. ``data``: the archive's bytes, already in
    memory (then ``archive`` only names it).
    """
    limits = limits or ArchiveLimits()
    source = archive.name
    try:
        size = archive.stat().st_size if data is None else len(data)
    except OSError as exc:
        raise ArchiveRejected(host, f"{source}: cannot read it ({exc.strerror or exc})") from exc
    max_size = max_archive_bytes(limits)
    if size > max_size:
        raise ArchiveRejected(
            host, f"{source}: {size} bytes, more than {max_size} bytes allowed for an archive; nothing was written"
        )
    try:
        # Plain tar only (hosts send `tar -cf`): a compressed stream could inflate without bound.
        with tarfile.open(archive, mode="r:") if data is None else tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            members: list[tarfile.TarInfo] = []
            # Iterate rather than getmembers(): the count cap must stop a header flood early.
            for member in tar:
                members.append(member)
                if len(members) > limits.max_members:
                    raise ArchiveRejected(
                        host, f"{source}: more than {limits.max_members} members; nothing was written"
                    )
            _check(members, host, source, limits)
            return _write(tar, members, dest, host, source, limits, sha256s)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ArchiveRejected(host, f"{source}: cannot read or unpack it ({exc})") from exc


def _write(
    tar: tarfile.TarFile,
    members: list[tarfile.TarInfo],
    dest: Path,
    host: str,
    source: str,
    limits: ArchiveLimits,
    sha256s: dict[PurePosixPath, str] | None = None,
) -> list[PurePosixPath]:
    dest.mkdir(parents=True, exist_ok=True)
    root = dest.resolve()
    written: list[PurePosixPath] = []
    try:
        _write_members(tar, members, root, dest, host, source, limits, written, sha256s)
    except BaseException:
        # Half an archive is not a result: take back what this archive wrote (never what was there).
        for rel in written:
            with contextlib.suppress(OSError):
                root.joinpath(*rel.parts).unlink()
        raise
    return written


def _write_members(
    tar: tarfile.TarFile,
    members: list[tarfile.TarInfo],
    root: Path,
    dest: Path,
    host: str,
    source: str,
    limits: ArchiveLimits,
    written: list[PurePosixPath],
    sha256s: dict[PurePosixPath, str] | None = None,
) -> None:
    budget = limits.max_total_bytes
    ready: set[Path] = set()  # directories checked and made: a host's out/ is ~200 files in one
    for member in members:
        if not member.isreg():
            continue
        rel = safe_member_name(member.name)
        assert rel is not None  # checked above
        target = root.joinpath(*rel.parts)
        src = tar.extractfile(member)
        if src is None:
            raise ArchiveRejected(host, f"{source}: member {member.name!r} has no content")
        if rel == _STREAM:
            with src:
                budget = _split_stream(src, root, dest, host, source, budget, limits.max_members - len(members),
                                       ready, written, sha256s)
            continue
        _make_parent(target, root, dest, ready, host, f"{source}: member {member.name!r}")
        # O_EXCL|O_NOFOLLOW: never write through an existing file or link.
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        written.append(rel)  # ours from here on, so a failure below takes it back
        digest = hashlib.sha256()
        # plain writes: a file object's set-up (fstat, isatty, lseek) was most of a small file's calls
        try:
            with src:
                while chunk := src.read(min(_CHUNK, budget + 1)):
                    budget -= len(chunk)
                    if budget < 0:
                        raise ArchiveRejected(host, f"{source}: content larger than its headers say")
                    _write_all(fd, chunk)
                    digest.update(chunk)
        finally:
            os.close(fd)
        if sha256s is not None:
            sha256s[rel] = digest.hexdigest()


def _write_all(fd: int, data: bytes) -> None:
    """All of ``data`` to ``fd`` (a plain ``write`` may take part of it)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _make_parent(target: Path, root: Path, dest: Path, ready: set[Path], host: str, what: str) -> None:
    """Make ``target``'s directory under ``root`` once (``ready``: those made already)."""
    if target.parent not in ready:
        # The destination is ours, but a directory inside it could still be a link planted earlier.
        if not target.parent.resolve().is_relative_to(root):
            raise ArchiveRejected(host, f"{what} resolves outside {dest}")
        target.parent.mkdir(parents=True, exist_ok=True)
        ready.add(target.parent)


def _split_stream(
    src: IO[bytes],
    root: Path,
    dest: Path,
    host: str,
    source: str,
    budget: int,
    files_allowed: int,
    ready: set[Path],
    written: list[PurePosixPath],
    sha256s: dict[PurePosixPath, str] | None,
) -> int:
    """Write the files of the trace stream ``src`` under ``root``, each created as a member would be (a
    name the archive also holds, or a file already there, refuses the archive); returns ``budget``
    less their bytes and ``_FRAME_COST`` a frame. At most ``files_allowed`` files (the archive's
    members count against the cap)."""
    where = f"{source}: {STREAM}"
    # by name (a frame's name is one path below traces/, checked by ``frames``): no path object a frame
    digests: dict[str, hashlib._Hash] = {}
    open_fds: dict[str, int] = {}
    try:
        for name, piece in frames(src, _CHUNK):
            fd = open_fds.pop(name, None)
            if fd is None:
                if len(open_fds) >= _STREAM_OPEN_MAX:
                    os.close(open_fds.pop(next(iter(open_fds))))
                target = root.joinpath(name)
                if name in digests:  # its descriptor was closed above: append to what this stream wrote
                    fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
                else:
                    if len(digests) >= files_allowed:
                        raise ArchiveRejected(host, f"{where}: more files than an archive may hold; nothing was written")
                    _make_parent(target, root, dest, ready, host, f"{where}: {name!r}")
                    try:
                        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
                    except FileExistsError:
                        raise ArchiveRejected(
                            host, f"{where}: {name!r} appears twice (in the stream and the archive); nothing was written"
                        ) from None
                    written.append(PurePosixPath(name))  # ours from here on, so a failure below takes it back
                    digests[name] = hashlib.sha256()
            open_fds[name] = fd  # the last used, last in the order
            budget -= len(piece) + _FRAME_COST
            if budget < 0:
                raise ArchiveRejected(host, f"{where}: more content and frames than an archive may hold; "
                                      "nothing was written")
            _write_all(fd, piece)
            digests[name].update(piece)
    except StreamError as exc:
        raise ArchiveRejected(host, f"{where}: {exc}; nothing was written") from exc
    finally:
        for held in open_fds.values():
            os.close(held)
    if sha256s is not None:
        sha256s.update((PurePosixPath(name), digest.hexdigest()) for name, digest in digests.items())
    return budget
