"""The bundle: the runner zipapp and one archive of the suite, pushed to a host as one transfer.

Locally: ``suite-<sha>.tar`` (the suite directory plus the normalised ``suite.json``, reproducible:
sorted entries, zero timestamps and owners) and ``bundle-<sha>.tar`` holding ``runner.pyz`` and
``suite.tar``, in a local cache (a replay's default: ``$XDG_CACHE_HOME/crosshost/bundles``) where
``index-<inputs sha>.json`` lets an unchanged suite and runner reuse their bundle after its sha is
checked. On a host: a content-addressed cache ``<workspace_root>/bundles/<bundle_sha>/`` with
``runner.pyz`` and ``suite/``, read-only. It is kept between runs, and a push is skipped when the host
already holds that sha and the unpacked tree is exactly what was pushed (checked before each use by
the host's Python, from a script the controller sends, against the digest the controller computes);
a changed entry is removed and pushed again. A cache entry appears by ``mv`` of a complete temporary
directory, so a half-pushed bundle is never mistaken for a complete one.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import posixpath
import secrets
import shlex
import stat
import tarfile
import tempfile
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from agent_runner.jsonfile import JSONObject
from agent_runner.pins import is_cache_name
from orchestrator.errors import InputError, RunnerCrashed, SuiteError, TransferError
from orchestrator.hosts.bundle_cache import prune_local_cache
from orchestrator.hosts.remote import HELPER_FLAGS, PYTHON_FLAGS
from orchestrator.hosts.transport.base import Host

if TYPE_CHECKING:
    from agent_runner.suite import Suite

SUITE_JSON = "suite.json"
_SHELL_TIMEOUT_S = 120.0


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _info(name: str, *, size: int = 0, directory: bool = False, executable: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if directory:
        info.type = tarfile.DIRTYPE
        info.mode = 0o755
    else:
        info.size = size
        info.mode = 0o755 if executable else 0o644
    return info


#: replaced by suite.json in the bundle: a runner reads suite.toml first, and a host may lack tomllib
_REPLACED_BY_SUITE_JSON = "suite.toml"


def _suite_files(suite_dir: Path) -> list[tuple[str, str]]:
    """(relative name, path) of every file of the suite, sorted by name; a symlink is refused (it
    could pull in anything). One ``lstat`` a file, on strings: a suite of hundreds of files is
    listed before every replay."""
    top = str(suite_dir)
    files: list[tuple[str, str]] = []
    for root, dirs, names in os.walk(top):
        dirs[:] = sorted(d for d in dirs if not is_cache_name(d))
        for d in dirs:
            if os.path.islink(os.path.join(root, d)):
                raise SuiteError(f"{Path(root) / d}: symlinks are not shipped in a suite; copy the files in")
        prefix = "" if root == top else os.path.relpath(root, top).replace(os.sep, "/") + "/"
        for name in sorted(names):
            if is_cache_name(name) or (name == _REPLACED_BY_SUITE_JSON and root == top):
                continue
            path = os.path.join(root, name)
            try:
                st = os.lstat(path)
            except OSError:  # gone since it was listed: not shipped
                continue
            if stat.S_ISLNK(st.st_mode):
                raise SuiteError(f"{Path(root) / name}: symlinks are not shipped in a suite; copy the file in")
            if stat.S_ISREG(st.st_mode):
                if st.st_nlink > 1:  # a hard link could be any file of the user's
                    raise SuiteError(f"{Path(root) / name}: hard-linked files are not shipped in a suite; copy the file in")
                files.append((prefix + name, path))
    return sorted(files)


def _suite_entries(suite_dir: Path) -> list[tuple[str, bytes, bool]]:
    """(relative name, bytes, executable) of every shipped file, in tar order."""
    entries = []
    for rel, path in _suite_files(suite_dir):
        with open(path, "rb") as fh:
            entries.append((rel, fh.read(), os.access(path, os.X_OK)))
    return entries


def _check_no_suite_json(suite_dir: Path) -> None:
    if (suite_dir / SUITE_JSON).exists():
        raise SuiteError(f"{suite_dir / SUITE_JSON}: reserved name (crosshost writes the normalised suite there)")


def _suite_tar_bytes(entries: list[tuple[str, bytes, bool]], normalised: JSONObject) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for rel, data, executable in entries:
            tar.addfile(_info(rel, size=len(data), executable=executable), io.BytesIO(data))
        doc = (json.dumps(normalised, indent=2, sort_keys=True) + "\n").encode()
        tar.addfile(_info(SUITE_JSON, size=len(doc)), io.BytesIO(doc))
    return buf.getvalue()


def _store_tar(out_dir: Path, prefix: str, data: bytes) -> tuple[Path, str]:
    sha = hashlib.sha256(data).hexdigest()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{prefix}-{sha}.tar"
    if not path.exists() or sha256_file(path) != sha:  # a damaged cached copy is replaced, never used
        _write_once(path, data)
    return path, sha


def build_suite_tar(suite_dir: Path, normalised: JSONObject, out_dir: Path) -> tuple[Path, str]:
    """``suite-<sha>.tar``: the suite's files with ``suite.json`` in place of ``suite.toml``.

    The same input gives the same bytes (and so the same sha)."""
    _check_no_suite_json(suite_dir)
    return _store_tar(out_dir, "suite", _suite_tar_bytes(_suite_entries(suite_dir), normalised))


def _write_once(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


@dataclass(frozen=True)
class Bundle:
    path: Path  # bundle-<sha>.tar: runner.pyz + suite.tar
    sha: str
    zipapp_sha: str  # sha256 of runner.pyz (its sources' digest is the trace pin runner_source_sha)
    suite_sha: str
    suite_dir: Path
    suite: Suite  # validated by the runner's one validator; ``suite.data`` is the shipped suite.json
    built: bool = False  # made now, not found in the cache: the cache grew

    @property
    def suite_name(self) -> str:
        return self.suite.name

    def remote_dir(self, workspace_root: str) -> str:
        return posixpath.join(workspace_root, "bundles", self.sha)

    def remote_runner(self, workspace_root: str) -> str:
        return posixpath.join(self.remote_dir(workspace_root), "runner.pyz")

    def remote_suite(self, workspace_root: str) -> str:
        return posixpath.join(self.remote_dir(workspace_root), "suite")


def read_suite(suite_dir: Path) -> Suite:
    """The suite, typed, through the runner's one validator (its SuiteError is exit 2)."""
    from agent_runner.suite import read_suite as _read

    if not suite_dir.is_dir():
        raise SuiteError(f"{suite_dir}: not a directory (expected a suite with suite.toml)")
    return _read(suite_dir)


_CACHE_KEY_FORMAT = b"crosshost bundle cache v2\0"


def _inputs_key(zipapp_sha: str, entries: list[tuple[str, bytes, bool]], normalised: JSONObject) -> str:
    """The sha of everything a bundle's bytes depend on (the runner, every file, the normalised suite)."""
    h = hashlib.sha256(_CACHE_KEY_FORMAT)
    h.update(zipapp_sha.encode() + b"\0")
    for rel, data, executable in entries:
        h.update(f"{len(rel)}:{rel}:{int(executable)}:{len(data)}:".encode())
        h.update(data)
    # compact (C encoder) is enough for a key: the indented suite.json is a function of the same dict
    h.update(json.dumps(normalised, sort_keys=True, separators=(",", ":")).encode())
    return h.hexdigest()


@dataclass(frozen=True)
class CacheEntry:
    """``index-<inputs sha>.json`` in the bundle cache: the bundle and suite tar the inputs built, and
    with which runner zipapp."""

    bundle_sha: str
    suite_sha: str
    zipapp_sha: str

    @staticmethod
    def path(out_dir: Path, key: str) -> Path:
        return out_dir / f"index-{key}.json"

    def to_bytes(self) -> bytes:
        return (json.dumps(asdict(self), sort_keys=True) + "\n").encode()

    @classmethod
    def read(cls, path: Path) -> CacheEntry | None:
        """The entry, or None when it is missing or not one (the bundle is then built again)."""
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict):
            return None
        bundle_sha, suite_sha, zipapp_sha = data.get("bundle_sha"), data.get("suite_sha"), data.get("zipapp_sha")
        if isinstance(bundle_sha, str) and isinstance(suite_sha, str) and isinstance(zipapp_sha, str):
            return cls(bundle_sha, suite_sha, zipapp_sha)
        return None


def _cached_bundle(out_dir: Path, key: str, zipapp_sha: str) -> tuple[Path, str, str] | None:
    """(path, bundle sha, suite sha) of the bundle built earlier from the same inputs, if it is intact."""
    entry = CacheEntry.read(CacheEntry.path(out_dir, key))
    if entry is None or entry.zipapp_sha != zipapp_sha:
        return None
    path = out_dir / f"bundle-{entry.bundle_sha}.tar"
    try:
        if sha256_file(path) != entry.bundle_sha:  # damaged or replaced: rebuilt, never pushed
            return None
    except OSError:
        return None
    return path, entry.bundle_sha, entry.suite_sha


def user_bundle_cache() -> Path:
    """``$XDG_CACHE_HOME/crosshost/bundles`` (default ``~/.cache/...``): shared by every ``--out``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "crosshost" / "bundles"


def bundle_cache_dir(out: Path) -> Path:
    """Where a replay writing to ``out`` keeps its bundles: one cache per user, so a new ``--out``
    does not rebuild an unchanged bundle; where that cannot be made (no home, read-only),
    ``<out>/.bundles``."""
    try:
        cache = user_bundle_cache()
        cache.mkdir(mode=0o700, parents=True, exist_ok=True)
        if os.access(cache, os.W_OK | os.X_OK):
            return cache
    except (OSError, RuntimeError):  # RuntimeError: Path.home() without a home
        pass
    return out / ".bundles"


def build_bundle(suite_dir: Path, out_dir: Path, *, runner: Path | None = None, suite: Suite | None = None) -> Bundle:
    """Validate the suite, build the runner zipapp (unless given) and the one bundle tar.

    ``out_dir`` is a cache: a bundle built there from the same inputs (same runner, files and
    normalised suite) is reused after its sha is checked, so a second replay skips both tars."""
    suite_dir = suite_dir.resolve()
    suite = suite if suite is not None else read_suite(suite_dir)
    normalised = suite.data
    _check_no_suite_json(suite_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # --out names a file, or a place the user cannot write
        raise InputError(f"{out_dir}: cannot create the bundle cache ({exc.strerror or exc}); check --out") from exc
    runner_bytes: bytes | None = None
    if runner is None:
        from orchestrator.hosts.runner_zipapp import runner_zipapp_bytes

        runner_bytes = runner_zipapp_bytes()
        zipapp_sha = hashlib.sha256(runner_bytes).hexdigest()
    else:
        zipapp_sha = sha256_file(runner)
    entries = _suite_entries(suite_dir)
    key = _inputs_key(zipapp_sha, entries, normalised)
    cached = _cached_bundle(out_dir, key, zipapp_sha)
    if cached is not None:
        path, sha, suite_sha = cached
        with contextlib.suppress(OSError):
            os.utime(path)  # used now: the local cache keeps the most recently used
        return Bundle(path, sha, zipapp_sha, suite_sha, suite_dir, suite)
    if runner is None:
        from orchestrator.hosts.runner_zipapp import build_runner_zipapp

        runner = build_runner_zipapp(out_dir)
    suite_tar, suite_sha = _store_tar(out_dir, "suite", _suite_tar_bytes(entries, normalised))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for member, data in (("runner.pyz", runner_bytes or runner.read_bytes()), ("suite.tar", suite_tar.read_bytes())):
            tar.addfile(_info(member, size=len(data)), io.BytesIO(data))
    path, sha = _store_tar(out_dir, "bundle", buf.getvalue())
    _write_once(CacheEntry.path(out_dir, key), CacheEntry(sha, suite_sha, zipapp_sha).to_bytes())
    return Bundle(path, sha, zipapp_sha, suite_sha, suite_dir, suite, built=True)


def replay_bundle(suite_dir: Path, cache: Path, suite: Suite | None = None) -> Bundle:
    """A replay's bundle from the local cache ``cache`` (``suite``: the suite already read from
    ``suite_dir``, else read here). Only a bundle built now (the cache grew)
    prunes the cache (``prune_local_cache``, never this bundle): a cache hit leaves it as it is, so an
    unchanged suite's replay does not stat every file of a cache that many runs filled."""
    bundle = build_bundle(suite_dir, cache, suite=suite)
    if bundle.built:
        prune_local_cache(cache, keep=frozenset({bundle.path, cache / f"suite-{bundle.suite_sha}.tar"}))
    return bundle


#: a host keeps this many bundles (newest used first) under <workspace_root>/bundles after a replay
KEEP_HOST_BUNDLES = 5
#: the name of the file in a run's workspace that says which bundle the run uses
IN_USE = "bundle-sha"


def in_use_marker(bundle: Bundle, workspace: str) -> str:
    """Shell text that marks ``workspace``'s run as using ``bundle``: pruning on any host skips it."""
    q = shlex.quote
    return f"echo {q(bundle.sha)} > {q(posixpath.join(workspace, IN_USE))}"


def prune_host_bundles_script(workspace_root: str, keep: int = KEEP_HOST_BUNDLES) -> str:
    """Shell text that removes all but the ``keep`` most recently used bundles of a host, never one
    a run in progress names in its ``runs/<id>/bundle-sha``; it always exits 0 (pruning is tidying)."""
    q = shlex.quote
    bundles, runs = posixpath.join(workspace_root, "bundles"), posixpath.join(workspace_root, "runs")
    return (
        f"( cd {q(bundles)} 2>/dev/null || exit 0; used=\" $(cat {q(runs)}/*/{IN_USE} 2>/dev/null | tr '\\n' ' ') \"; "
        f"ls -1t | grep -E '^[0-9a-f]{{64}}$' | tail -n +{keep + 1} | while read -r d; do "
        f'case "$used" in *" $d "*) ;; *) chmod -R u+w -- "$d"; rm -rf -- "$d" ;; esac; done ) >/dev/null 2>&1; true'
    )


#: digest of an unpacked bundle on a host, run by the host's Python from this text (never from the
#: cache it checks): the bundle directory's own mode, and every path under it, its kind, whether
#: anything may write it, a file's content. ``held``: a file of the root already read, as (its name,
#: its stat, its bytes): digested from those bytes, never read again.
_TREE_DIGEST_FN = r"""
import hashlib, os, stat, sys
def tree_digest(root, held=None):
    lines = ["d %d  ." % int(bool(os.lstat(root).st_mode & 0o222))]
    for base, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(base, name)
            st, data = held[1:] if held is not None and base == root and name == held[0] else (os.lstat(p), None)
            kind = "d" if stat.S_ISDIR(st.st_mode) else "f" if stat.S_ISREG(st.st_mode) else "x"
            body = ""
            if kind == "f" and data is not None:
                body = hashlib.sha256(data).hexdigest()
            elif kind == "f":
                h = hashlib.sha256()
                with open(p, "rb") as fh:
                    for chunk in iter(lambda: fh.read(1 << 20), b""):
                        h.update(chunk)
                body = h.hexdigest()
            lines.append("%s %d %s %s" % (kind, int(bool(st.st_mode & 0o222)), body, os.path.relpath(p, root)))
    return hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()
"""
_TREE_DIGEST_PY = _TREE_DIGEST_FN + "print(tree_digest(sys.argv[1]))\n"

#: the runner's exit when its start refused the bundle (``_CHECKED_START_PY``): push it, then run again
BUNDLE_REFUSED_EXIT = 75

#: the runner's start from a bundle on a host, run by the host's Python from this text (argv: the
#: digest the bundle must show, its ``runner.pyz``, the runner's arguments, so ``ps`` still shows
#: ``runner.pyz run ...``). ``runner.pyz`` is read once; the bundle is digested as ``_TREE_DIGEST_PY``
#: does, its zipapp from those bytes, and only when it is the bundle the controller built are those
#: bytes run, in this interpreter (as ``python runner.pyz`` runs it), from a sealed ``memfd`` (no
#: write, no resize: ``/proc/self/fd/N``, where the zipapp's importer reopens it for every later
#: import): a zipapp renamed over the bundle's after the check is never run. ``sys.argv[0]`` stays
#: the bundle's ``runner.pyz`` (``pins.runner_home``). A Python or kernel without ``memfd_create`` (or
#: without ``/proc``) runs the zipapp by its path, safe only where the bundle is root's alone. Else
#: nothing of it is read as code and the exit is ``BUNDLE_REFUSED_EXIT`` (a bundle missing, changed,
#: or that cannot be read). A bundle it runs has its mtime set to now: it was used.
_CHECKED_START_PY = _TREE_DIGEST_FN + r"""
want, pyz = sys.argv[1], sys.argv[2]
try:
    fd = os.open(pyz, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        held = (os.path.basename(pyz), os.fstat(fd), b"".join(iter(lambda: os.read(fd, 1 << 20), b"")))
    finally:
        os.close(fd)
    ok = stat.S_ISREG(held[1].st_mode) and tree_digest(os.path.dirname(pyz), held) == want
except OSError:
    ok = False
if not ok:
    sys.exit(REFUSED)
try:  # the bundle's mtime says when it was last used (the host keeps the newest few)
    os.utime(os.path.dirname(pyz))
except OSError:
    pass
def sealed(data):
    try:
        import fcntl
        fd = os.memfd_create("runner.pyz", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except (AttributeError, ImportError, OSError):
        return None
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL)
        if os.path.getsize("/proc/self/fd/%d" % fd) == len(data):
            return "/proc/self/fd/%d" % fd
    except (AttributeError, OSError):
        pass
    os.close(fd)
    return None
del sys.argv[:2]
data = held[2]
del held
run_from = sealed(data) or pyz
import zipimport
try:
    __loader__ = zipimport.zipimporter(run_from)
except zipimport.ZipImportError:  # a plain script, as ``python runner.pyz`` runs one: from the bytes read
    __file__, code = pyz, compile(data, pyz, "exec")
else:
    __file__, code = os.path.join(run_from, "__main__.py"), __loader__.get_code("__main__")
    sys.path.insert(0, run_from)
del data
exec(code)
""".replace("REFUSED", str(BUNDLE_REFUSED_EXIT))


_UNPACKED: dict[str, str] = {}
#: every host's push asks at once (up to 64 workers): the bundle is read and hashed by one of them
_UNPACKED_LOCK = threading.Lock()


def unpacked_digest(bundle: Bundle) -> str:
    """What ``_TREE_DIGEST_PY`` prints for this bundle unpacked intact (read-only) on a host."""
    with _UNPACKED_LOCK:
        if bundle.sha not in _UNPACKED:
            _UNPACKED[bundle.sha] = _unpacked_digest(bundle.path)
        return _UNPACKED[bundle.sha]


def _unpacked_digest(path: Path) -> str:
    lines = ["d 0  ."]  # the bundle directory itself, read-only

    def add(kind: str, rel: str, data: bytes | None = None) -> None:
        body = hashlib.sha256(data).hexdigest() if data is not None else ""
        lines.append(f"{kind} 0 {body} {rel}")

    with tarfile.open(path) as outer:
        members = {m.name: outer.extractfile(m) for m in outer.getmembers() if m.isfile()}
        runner = members["runner.pyz"]
        suite_tar = members["suite.tar"]
        assert runner is not None and suite_tar is not None
        add("f", "runner.pyz", runner.read())
        add("d", "suite")
        dirs: set[str] = set()
        with tarfile.open(fileobj=io.BytesIO(suite_tar.read())) as inner:
            for m in inner.getmembers():
                rel = posixpath.normpath(m.name)
                parts = rel.split("/")
                for i in range(1, len(parts)):
                    dirs.add("/".join(parts[:i]))
                if m.isdir():
                    dirs.add(rel)
                else:
                    data = inner.extractfile(m)
                    add("f", f"suite/{rel}", data.read() if data is not None else b"")
        for d in dirs:
            add("d", f"suite/{d}")
    return hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()


def bundle_present_test(bundle: Bundle, workspace_root: str, python: str = "python3") -> str:
    """Shell text that exits 0 when the bundle is published under ``workspace_root`` on the host and
    is exactly what was pushed (every file's content, nothing added, nothing writable)."""
    final = shlex.quote(bundle.remote_dir(workspace_root))
    digest = f"{shlex.quote(python)} {HELPER_FLAGS} -c {shlex.quote(_TREE_DIGEST_PY)} {final} 2>/dev/null"
    # touch: the bundle's mtime says when it was last used (the host keeps the newest few)
    return (
        f'test -f {final}/runner.pyz && test -d {final}/suite && test "$({digest})" = {unpacked_digest(bundle)} '
        f"&& touch {final}"
    )


def checked_runner_argv(bundle: Bundle, workspace_root: str, python: str, args: list[str]) -> list[str]:
    """The runner's command line on a host, started from ``bundle`` under ``workspace_root`` only when
    that is exactly what was pushed: the check is the first thing the runner's own interpreter does
    (``_CHECKED_START_PY``; no Python of its own, no exec of its own), ``BUNDLE_REFUSED_EXIT`` when it fails."""
    digest = unpacked_digest(bundle)
    return [python, *PYTHON_FLAGS, "-c", _CHECKED_START_PY, digest, bundle.remote_runner(workspace_root), *args]


def bundle_remove_script(bundle: Bundle, workspace_root: str) -> str:
    """Remove a published bundle that failed ``bundle_present_test`` (read-only: made writable first)."""
    final = shlex.quote(bundle.remote_dir(workspace_root))
    return f"if test -e {final}; then chmod -R u+w {final} 2>/dev/null; rm -rf {final} && echo bundle-replaced; fi"


def ensure_bundle(
    host: Host, bundle: Bundle, workspace_root: str, *, look: bool = True, python: str = "python3"
) -> bool:
    """Make ``<workspace_root>/bundles/<sha>/`` exist on ``host``; True when it was pushed now.

    One exec to look, one SFTP put of one file, one exec to unpack and publish it. ``look=False``:
    the caller ran ``bundle_present_test`` itself (folded into one of its own execs) and it failed.
    """
    final = bundle.remote_dir(workspace_root)
    q = shlex.quote
    if look:
        script = f"{{ {bundle_present_test(bundle, workspace_root, python)}; }} || {{ {bundle_remove_script(bundle, workspace_root)}; exit 1; }}"
        if host.exec(["sh", "-c", script], _SHELL_TIMEOUT_S).ok:
            return False
    tmp = posixpath.join(workspace_root, "bundles", f".tmp-{bundle.sha[:12]}-{secrets.token_hex(4)}")
    # bundles/ itself is passable by anyone (an attempt's own uid reads its suite); the temporary
    # directory is private until it is complete
    bundles = posixpath.dirname(tmp)
    prep = host.exec(["sh", "-c", f"mkdir -p {q(bundles)} && chmod a+x {q(bundles)} && umask 077 && mkdir {q(tmp)}"],
                     _SHELL_TIMEOUT_S)
    if not prep.ok:
        raise TransferError(host.name, f"cannot create {tmp}: {prep.stderr.strip() or prep.exit_code}")
    try:
        host.put(bundle.path, posixpath.join(tmp, "bundle.tar"))
        # Our own archive, so plain tar is fine; ``mv -T`` publishes it atomically. If another replay
        # published the same sha first, mv fails and the existing entry holds the same bytes.
        script = (
            f"cd {q(tmp)} && tar -xf bundle.tar && mkdir suite && tar -xf suite.tar -C suite "
            # read-only for everyone (a run may not change the next one's bundle), before it is published
            f"&& rm -f bundle.tar suite.tar && chmod -R a-w,a+rX . "
            f"&& {{ mv -T {q(tmp)} {q(final)} 2>/dev/null || test -f {q(final)}/runner.pyz; }}"
        )
        unpack = host.exec(["sh", "-c", script], _SHELL_TIMEOUT_S)
        if not unpack.ok:
            raise RunnerCrashed(host.name, f"unpacking the bundle failed: {unpack.stderr.strip() or unpack.exit_code}")
    finally:
        host.exec(["sh", "-c", f"chmod -R u+w {q(tmp)} 2>/dev/null; rm -rf {q(tmp)}"], _SHELL_TIMEOUT_S)
    return True

