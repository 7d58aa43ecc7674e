#!/usr/bin/env python3
"""A machine-wide cache of what ``make setup`` installs from the registries, keyed by content (stdlib only).

    python3 tools/setupcache.py restore NAME DEST KEYFILE... [--key-text TEXT]...
    python3 tools/setupcache.py store NAME SRC KEYFILE... [--key-text TEXT]...
    .venv/bin/python tools/setupcache.py satisfied 'crosshost[dev]'

The key is the SHA-256 of the key files' bytes and the key texts (e.g. ``node --version``), so an
entry serves only the pins it was installed from: a changed lockfile or interpreter is a new key, an
absent or damaged entry a fresh install (the Makefile still checks what was restored). ``restore``
copies the entry to DEST (exit 0) or says it has none (exit 1), and marks it used; a venv's absolute paths (its scripts'
first lines, ``pyvenv.cfg``, ``bin/activate*``) are rewritten from the directory it was stored from to
DEST. ``store`` copies SRC in, atomically: a concurrent store or an interrupted one leaves no half entry;
then it removes the entries of the same name but the ``KEEP`` used last.
A fresh clone on a machine that already installed the same pins then copies instead of downloading,
unpacking and compiling again. ``satisfied`` (run by the venv's interpreter: it needs ``packaging``)
says whether the installed distributions meet a requirement and all it requires in turn, so a lock
installed with ``--no-deps`` that no longer meets ``pyproject.toml`` fails the set-up, naming what.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(os.environ.get("CROSSHOST_SETUP_CACHE", "/var/cache/crosshost-setup"))
ORIGIN = ".crosshost-setupcache-origin"
#: entries kept of each name, the most recently stored or restored: older pins' copies (a GB each for
#: the agent CLIs) are removed when a new one is stored
KEEP = 2


def key(files: list[str], texts: list[str]) -> str:
    h = hashlib.sha256()
    for name in files:
        h.update(b"file\0" + Path(name).read_bytes() + b"\0")
    for text in texts:
        h.update(b"text\0" + text.encode() + b"\0")
    return h.hexdigest()[:24]


def entry(name: str, files: list[str], texts: list[str]) -> Path:
    return ROOT / f"{name}-{key(files, texts)}"


def _copy(src: Path, dest: Path) -> None:
    # cp -a: modes, times and symlinks as they are, and a good deal faster than copytree on 10,000 files
    subprocess.run(["cp", "-a", "--", str(src), str(dest)], check=True)


def _rewrite(dest: Path, old: str) -> None:
    """A moved venv: the paths naming where it was built now name ``dest``."""
    new = str(dest)
    if old == new:
        return
    candidates = [dest / "pyvenv.cfg"]
    bin_dir = dest / "bin"
    if bin_dir.is_dir():
        candidates += sorted(bin_dir.iterdir())
    for path in candidates:
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192] or old.encode() not in data:
            continue  # binaries (ruff, the interpreter) keep their bytes
        path.write_bytes(_launchable(data.replace(old.encode(), new.encode())))


def _launchable(script: bytes) -> bytes:
    """A script whose first line names an interpreter the kernel cannot start from a shebang (a path
    with a space, or a line longer than 127 bytes) gets the ``/bin/sh`` first lines pip writes for
    such a place instead; any other script as it is."""
    first, nl, rest = script.partition(b"\n")
    interpreter = first[2:].strip() if first.startswith(b"#!") else b""
    if not interpreter.startswith(b"/") or (b" " not in interpreter and len(first) <= 127):
        return script
    quoted = b'"' + interpreter.replace(b'"', b'\\"') + b'"'
    return b"#!/bin/sh\n'''exec' " + quoted + b' "$0" "$@"\n' + b"' '''" + nl + rest


def restore(name: str, dest: Path, files: list[str], texts: list[str]) -> int:
    src = entry(name, files, texts)
    origin = src / ORIGIN
    if not origin.is_file():
        print(f"setupcache: no {name} cached for these pins ({src}): installing", file=sys.stderr)
        return 1
    dest = dest.absolute()
    if dest.is_symlink():
        dest.unlink()
    elif dest.exists():
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        _copy(src, tmp / "d")
        (tmp / "d" / ORIGIN).unlink()
        os.rename(tmp / "d", dest)
    except (OSError, subprocess.CalledProcessError) as exc:  # removed meanwhile (another clone's store)
        print(f"setupcache: {name} could not be copied from {src} ({exc}): installing", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    with contextlib.suppress(OSError):
        os.utime(origin)  # used now: the last an older store removes
    _rewrite(dest, origin.read_text())
    print(f"setupcache: {name} copied from {src} (rm -rf it to install afresh)", file=sys.stderr)
    return 0


def store(name: str, src: Path, files: list[str], texts: list[str]) -> int:
    target = entry(name, files, texts)
    if (target / ORIGIN).is_file():
        return 0
    ROOT.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=ROOT))
    try:
        _copy(src, tmp / "d")
        (tmp / "d" / ORIGIN).write_text(str(src.absolute()))
        if target.exists():
            shutil.rmtree(target)  # an entry without its origin file: a damaged one
        try:
            os.rename(tmp / "d", target)
        except OSError:
            if not (target / ORIGIN).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    prune(name)
    return 0


def prune(name: str, keep: int = KEEP) -> list[Path]:
    """Remove the entries of ``name`` but the ``keep`` used last (stored or restored); each is renamed
    away first, so a restore finds an entry whole or not at all. The entries removed."""
    pattern = re.compile(re.escape(name) + r"-[0-9a-f]{24}")
    used: list[tuple[float, Path]] = []
    for path in ROOT.iterdir():
        if pattern.fullmatch(path.name):
            with contextlib.suppress(OSError):
                used.append(((path / ORIGIN).stat().st_mtime, path))
    removed = [path for _, path in sorted(used, reverse=True)[keep:]]
    for path in removed:
        gone = Path(tempfile.mkdtemp(prefix=f".{path.name}.gone.", dir=ROOT))
        with contextlib.suppress(OSError):
            os.rename(path, gone / "d")
        shutil.rmtree(gone, ignore_errors=True)
    return removed


def satisfied(requirement: str) -> int:
    import importlib.metadata as metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    unmet: list[str] = []
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [Requirement(requirement)]
    while todo:
        req = todo.pop()
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            unmet.append(f"{req} (not installed)")
            continue
        if not req.specifier.contains(have, prereleases=True):
            unmet.append(f"{req} (installed: {have})")
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        envs = [{"extra": ""}] + [{"extra": e} for e in req.extras]
        for line in metadata.requires(req.name) or []:
            sub = Requirement(line)
            if sub.marker is None or any(sub.marker.evaluate(env) for env in envs):
                todo.append(sub)
    for line in sorted(set(unmet)):
        print(f"unmet: {line}", file=sys.stderr)
    return 1 if unmet else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["satisfied"] and len(argv) == 2:
        return satisfied(argv[1])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("restore", "store"))
    parser.add_argument("name")
    parser.add_argument("dir", type=Path)
    parser.add_argument("keyfiles", nargs="+")
    parser.add_argument("--key-text", action="append", default=[])
    args = parser.parse_args(argv)
    if args.action == "restore":
        return restore(args.name, args.dir, args.keyfiles, args.key_text)
    return store(args.name, args.dir, args.keyfiles, args.key_text)


if __name__ == "__main__":
    sys.exit(main())
