"""The runner zipapp's ``__main__.py``: run the runner, from bytecode compiled on an earlier run when
that is safe. Shipped to hosts, so standard library only and Python 3.9.

Python never writes the bytecode of modules it imports from a zip: every run from ``runner.pyz``
compiled the whole runner again (a few hundred milliseconds of every run's CPU). A root runner of a
pushed bundle (``<workspace_root>/bundles/<sha>/runner.pyz``) therefore keeps the runner's sources
beside the bundle, in ``bundles/<sha>.pyc-<cache tag>/`` (one per bundle and Python version), and
imports them from there so the interpreter caches their bytecode in that directory's ``__pycache__``.

Used only where an attempt cannot write it: the runner is root (its attempts run as uids of their
own), the directory and every directory above it belong to root and no one else may write them
(a sticky directory such as ``/tmp`` excepted: no one else can move root's entries out of it), and
every source there is byte for byte the one in the zipapp the controller checked before this run.
Anything else runs from the zipapp, as before. The directory appears by a rename of a complete one;
directories of bundles no longer on the host are removed when a new one is made.
"""

from __future__ import annotations

import os
import stat
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing is imported by the runner, with the collector paused
    from typing import Dict, List, Optional

PACKAGE = "agent_runner"
#: the zipapp's list of the runner's ``*.py`` (one name a line), written by ``runner_zipapp``
SOURCES = "agent_runner.sources"
_SUFFIX = ".pyc-"


def _hex64(name: str) -> bool:
    return len(name) == 64 and all(c in "0123456789abcdef" for c in name)


def cache_dir(pyz: str) -> Optional[str]:
    """Where the runner of the bundle holding ``pyz`` keeps its compiled copy (None: not a bundle's)."""
    bundle = os.path.dirname(os.path.abspath(pyz))
    if os.path.basename(pyz) != "runner.pyz" or not _hex64(os.path.basename(bundle)):
        return None
    return bundle + _SUFFIX + sys.implementation.cache_tag


def only_root_writes(path: str) -> bool:
    """``path`` (resolved) and every directory above it belong to root and no one else may write
    them; a sticky directory above may be writable by all (no one else can rename root's entries)."""
    current = os.path.realpath(path)
    first = True
    while True:
        try:
            st = os.lstat(current)
        except OSError:
            return False
        if st.st_uid != 0 or (st.st_mode & 0o022 and (first or not st.st_mode & stat.S_ISVTX)):
            return False
        parent = os.path.dirname(current)
        if parent == current:
            return True
        current, first = parent, False


def zipped_sources(archive: str) -> Dict[str, bytes]:
    """The runner's ``*.py`` in the zipapp ``archive``, by file name (read by the importer that runs
    this file: ``zipfile`` alone would cost more than a run saves)."""
    import zipimport

    importer = zipimport.zipimporter(archive)
    names = importer.get_data(SOURCES).decode().split()
    return {name: importer.get_data(f"{PACKAGE}/{name}") for name in names}


def _entries_only_root_write(directory: str) -> bool:
    """Every entry of ``directory`` is a file or directory of root's that no one else may write (the
    directories above are ``only_root_writes``'s): a module not yet imported, or its bytecode, is
    never one another uid could have changed."""
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                st = entry.stat(follow_symlinks=False)
                if st.st_uid != 0 or st.st_mode & 0o022 or not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                    return False
    except OSError:
        return False
    return True


def _same_sources(package: str, sources: Dict[str, bytes]) -> bool:
    try:
        names = sorted(n for n in os.listdir(package) if n.endswith(".py"))
        if names != sorted(sources):
            return False
        for name in names:
            with open(os.path.join(package, name), "rb") as handle:
                if handle.read() != sources[name]:
                    return False
    except OSError:
        return False
    return True


def _make(cache: str, sources: Dict[str, bytes]) -> None:
    """Write the sources into a new directory beside ``cache`` and rename it into place (a run at the
    same time may have made it first: then that one is used, when it passes the same checks)."""
    import shutil

    work = f"{cache}.tmp-{os.getpid()}-{os.urandom(4).hex()}"  # hosts in PID namespaces share pids
    package = os.path.join(work, PACKAGE)
    try:
        # explicit modes, whatever the host's umask: under umask 000 the files and the __pycache__
        # the interpreter makes would be writable by every uid, the attempts' included
        os.makedirs(os.path.join(package, "__pycache__"), mode=0o755)
        for name, data in sources.items():
            fd = os.open(os.path.join(package, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with os.fdopen(fd, "wb") as handle:
                os.fchmod(fd, 0o644)
                handle.write(data)
        for path in (work, package, os.path.join(package, "__pycache__")):
            os.chmod(path, 0o755)
        os.rename(work, cache)
    except OSError:
        shutil.rmtree(work, ignore_errors=True)
        return
    bundles = os.path.dirname(cache)
    try:
        names = os.listdir(bundles)
    except OSError:
        return
    for name in names:  # the compiled copies of bundles pruned from this host
        sha, sep, _tag = name.partition(_SUFFIX)
        if sep and _hex64(sha) and not os.path.isdir(os.path.join(bundles, sha)):
            shutil.rmtree(os.path.join(bundles, name), ignore_errors=True)


def compiled_path(pyz: str, archive: Optional[str] = None) -> Optional[str]:
    """The directory to import the runner from instead of ``pyz`` (None: import it from the zipapp).
    ``archive``: where this zipapp's bytes are read (the checked start's sealed copy of ``pyz``)."""
    cache = cache_dir(pyz)
    if cache is None or os.geteuid() != 0 or sys.dont_write_bytecode or not only_root_writes(os.path.dirname(cache)):
        return None
    try:
        sources = zipped_sources(archive or pyz)
    except (OSError, ImportError, UnicodeDecodeError):
        return None
    if not os.path.isdir(cache):
        _make(cache, sources)
    package = os.path.join(cache, PACKAGE)
    if not (only_root_writes(package) and _entries_only_root_write(package) and _same_sources(package, sources)):
        return None
    pycache = os.path.join(package, "__pycache__")
    if os.path.lexists(pycache) and not (only_root_writes(pycache) and _entries_only_root_write(pycache)):
        return None
    return cache


def main(argv: List[str]) -> int:
    # argv[0] is the bundle's runner.pyz; the importer running this file may read a sealed copy of it
    archive = getattr(globals().get("__loader__"), "archive", None)
    path = compiled_path(argv[0], archive) if argv else None
    if path is not None:
        sys.path.insert(0, path)
    from agent_runner import collector  # from the path just chosen, as the rest of the runner

    collector.pause()  # this file is the program's entry: until the runner has loaded (collector.py)
    from agent_runner.__main__ import main as run

    return run()


def end(code: int) -> None:
    """End the process with ``code`` once the runner returned it: every thread it left that is not a
    daemon is waited for and the standard streams are flushed, as the interpreter's exit does, but the
    interpreter's teardown (freeing every object of a run, 40-100 ms of a host's run on this machine,
    before the exec's shell sees the exit) is skipped: everything the runner writes is closed by then."""
    import contextlib
    import threading

    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more can reach its reader
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    end(main(sys.argv))
