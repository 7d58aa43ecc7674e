#!/usr/bin/env python3
"""A real Docker daemon for the tests and the demo, and small images built offline (stdlib only).

    python tools/testdocker.py up        # start dockerd (if it is not running) and build the images;
                                         # says "dockerd started on ..." or "... already running ..."
    python tools/testdocker.py images    # build the images that are missing, print their names
    python tools/testdocker.py inventory PATH   # write hosts.toml: local and a container of each image
    python tools/testdocker.py down      # stop the daemon this tool started

The daemon is Debian's ``dockerd`` (package docker.io, installed by ``make setup``) with a socket,
data root and exec root of its own (``SOCKET``, ``DATA_ROOT``), so it never meets a Docker the
machine may run already. It runs without systemd, started in the background here, with what works in
a sandbox without a bridge or iptables: ``--bridge=none --iptables=false`` (containers get
``--network none``; the model proxy reaches them through the exec channel, not a network), the
overlay2 storage driver and cgroupfs.

Images are assembled without a registry: a root filesystem of the Debian packages this machine has
installed (``SEED_PACKAGES`` and their dependencies, files as ``dpkg -L`` lists them, a
``/var/lib/dpkg/status`` naming them), ``docker import``-ed with an image config. ``VARIANTS`` differ
the way real images do: a locale default, a time zone, a file under /etc and one under /opt. A
built image is labelled with the hash of its recipe (the packages' versions included) and reused
while that hash holds: the tests never rebuild an image that is there.

Several test sessions may share the daemon: each holds a lease (``Lease``) and the last one out
stops a daemon that a lease started (one a person started with ``up`` is left running).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SOCKET = "/run/crosshost-docker.sock"
DOCKER_HOST = f"unix://{SOCKET}"
DATA_ROOT = Path("/var/lib/crosshost-docker")
EXEC_ROOT = Path("/run/crosshost-docker")
STATE = Path("/var/tmp/crosshost-docker")
PIDFILE = STATE / "dockerd.pid"
LOG = STATE / "dockerd.log"
LOCK = STATE / "lock"
LEASES = STATE / "leases"
#: present while the daemon running was started by a lease: the last lease out stops it
STARTED_BY_LEASE = STATE / "started-by-lease"
START_TIMEOUT_S = 60.0
DOCKERD_ARGS = [
    "--host", DOCKER_HOST,
    "--data-root", str(DATA_ROOT),
    "--exec-root", str(EXEC_ROOT),
    "--pidfile", str(PIDFILE),
    "--bridge=none", "--iptables=false", "--ip6tables=false", "--ip-masq=false",
    "--storage-driver=overlay2",
    "--exec-opt", "native.cgroupdriver=cgroupfs",
    "--log-level", "warn",  # info logs every gRPC state change: megabytes per test session
]  # fmt: skip

#: what an image needs: a shell and coreutils (``timeout``, ``mktemp``), tar, python3 for the runner,
#: strace for explain's file evidence, tzdata so TZ means something, util-linux (unshare, setpriv) so
#: the runner tries its isolation as on any Debian host
SEED_PACKAGES = (
    "base-files", "dash", "coreutils", "tar", "findutils", "grep", "sed", "gzip", "python3", "tzdata",
    "libc-bin", "strace", "procps", "util-linux",
)  # fmt: skip
REPOSITORY = "crosshost-test"


@dataclass(frozen=True)
class Variant:
    """One test image: ``ENV`` defaults and extra files (path -> text) over the common root fs."""

    name: str
    env: tuple[tuple[str, str], ...]
    files: tuple[tuple[str, str], ...]


#: two images that differ as real ones do: the locale default (``wc -m`` counts characters in a UTF-8
#: locale, bytes in POSIX), the time zone, a config file under /etc and a feature flag under /opt
VARIANTS = (
    Variant(
        "py-utf8",
        (("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"), ("LANG", "C.UTF-8"), ("TZ", "UTC")),
        (("etc/crosshost-image.conf", "channel=stable\n"),),
    ),
    Variant(
        "py-posix",
        (("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"), ("TZ", "America/New_York")),
        (
            ("etc/crosshost-image.conf", "channel=beta\n"),
            ("opt/crosshost-demo/feature.flag", ""),
        ),
    ),
)


class DockerError(RuntimeError):
    """The daemon or an image could not be had; the message says why (with the log's tail)."""


def docker(*args: str, input: bytes | None = None, timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["docker", "-H", DOCKER_HOST, *args], input=input, capture_output=True, timeout=timeout, check=False
    )


def responding() -> bool:
    try:
        return docker("version", "--format", "{{.Server.Version}}", timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _pid_alive(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:  # this process started it: reaped, not a zombie
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _daemon_pid() -> int | None:
    with contextlib.suppress(OSError, ValueError):
        pid = int(PIDFILE.read_text().strip())
        if pid > 1 and _pid_alive(pid):
            return pid
    return None


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    STATE.mkdir(parents=True, exist_ok=True)
    with open(LOCK, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _log_tail(n: int = 15) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(LOG.read_text(errors="replace").splitlines()[-n:])
    return "(no log)"


def _start_locked() -> bool:
    """Start dockerd unless it answers; True when this call started it. The caller holds the lock."""
    if responding():
        return False
    if _daemon_pid() is None and os.path.exists(SOCKET):
        os.unlink(SOCKET)  # left by a daemon that died
    for tool in ("dockerd", "docker", "containerd", "runc"):
        if not any(os.access(os.path.join(d, tool), os.X_OK) for d in os.environ.get("PATH", "").split(":") + ["/usr/sbin", "/sbin"]):
            raise DockerError(f"{tool} is not installed (apt-get install docker.io, or run make setup)")
    EXEC_ROOT.mkdir(parents=True, exist_ok=True)
    DATA_ROOT.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PATH=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    with open(LOG, "wb") as log:  # this daemon's log only
        proc = subprocess.Popen(
            ["dockerd", *DOCKERD_ARGS], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            start_new_session=True, env=env, cwd="/",
        )  # fmt: skip
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DockerError(f"dockerd exited {proc.returncode}:\n{_log_tail()}")
        if responding():
            return True
        time.sleep(0.3)
    proc.kill()
    raise DockerError(f"dockerd did not answer on {SOCKET} within {START_TIMEOUT_S:.0f}s:\n{_log_tail()}")


def _stop_locked() -> None:
    pid = _daemon_pid()
    if pid is None:
        return
    os.kill(pid, signal.SIGTERM)
    # an idle daemon ends within 3 s; after a test session it has been seen to wait out the whole
    # deadline (its containerd gone, a container's removal still "in progress"): killed after 10 s,
    # which leaves what the 30 s did (the next start removes the leftovers)
    deadline = time.monotonic() + 10
    while _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _pid_alive(pid):
        os.kill(pid, signal.SIGKILL)
    # dockerd's own containerd goes with it; a shim of a container still running is left to the daemon's
    # next start (a lease removes the session's containers before it stops the daemon)


def _remove_leftovers_locked() -> None:
    """Remove the containers crosshost started that a test session killed before its clean-up left
    behind. Called only for a daemon that test sessions started and none of them holds any more, so
    every such container is a leftover (a person's daemon, started by ``up``, is never touched): the
    hosts' containers and the tests' own."""
    ids = []
    for label in ("crosshost.host", "crosshost.test"):  # one filter each: docker ANDs repeated filters
        listed = docker("ps", "-aq", "--filter", f"label={label}", timeout=60)
        ids += listed.stdout.decode().split() if listed.returncode == 0 else []
    if ids:
        docker("rm", "-f", *ids, timeout=120)


def up() -> bool:
    """Start the daemon for a person (the demo, ``up``): it stays until ``down``. True when started."""
    with _locked():
        started = _start_locked()
        STARTED_BY_LEASE.unlink(missing_ok=True)
        return started


def down() -> None:
    with _locked():
        _stop_locked()
        STARTED_BY_LEASE.unlink(missing_ok=True)


class Lease:
    """A test session's hold on the daemon: started if needed; the last lease out stops a daemon
    that a lease started. Dead holders' leases are ignored."""

    def __init__(self) -> None:
        self.path = LEASES / str(os.getpid())

    def __enter__(self) -> Lease:
        with _locked():
            LEASES.mkdir(parents=True, exist_ok=True)
            if _start_locked():
                STARTED_BY_LEASE.touch()
            if STARTED_BY_LEASE.exists() and not self._others():
                _remove_leftovers_locked()
            self.path.touch()
        return self

    def _others(self) -> list[Path]:
        return [p for p in LEASES.iterdir() if p.name.isdigit() and p != self.path and _pid_alive(int(p.name))]

    def __exit__(self, *exc: object) -> None:
        with _locked():
            self.path.unlink(missing_ok=True)
            if not self._others() and STARTED_BY_LEASE.exists():
                # a container still running makes the daemon's stop wait out its stop timeout (10 s
                # each, measured 11-30 s at the end of a test session): removed first, they cost none;
                # the stop happens whatever the removal did (a hung daemon is when it matters most)
                try:
                    _remove_leftovers_locked()
                finally:
                    _stop_locked()
                    STARTED_BY_LEASE.unlink(missing_ok=True)


# --------------------------------------------------------------------------------------------- images


def _installed() -> dict[str, tuple[str, list[str]]]:
    """package -> (version, the packages it depends on), from this machine's dpkg database."""
    out = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Package}\t${Version}\t${db:Status-Abbrev}\t${Pre-Depends}, ${Depends}\n"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    found: dict[str, tuple[str, list[str]]] = {}
    for line in out.splitlines():
        name, version, status, deps = (line.split("\t") + ["", "", ""])[:4]
        if not status.startswith("ii"):
            continue
        wanted = []
        for alt in deps.split(","):
            choices = [re.split(r"[\s(:]", c.strip())[0] for c in alt.split("|") if c.strip()]
            if choices:
                wanted.append(choices)
        found[name] = (version, ["|".join(c) for c in wanted])
    return found


def packages() -> dict[str, str]:
    """The image's packages (the seeds and what they depend on, as installed here): name -> version."""
    db = _installed()
    missing = [p for p in SEED_PACKAGES if p not in db]
    if missing:
        raise DockerError(f"not installed on this machine: {', '.join(missing)} (apt-get install {' '.join(missing)})")
    todo, chosen = list(SEED_PACKAGES), {}
    while todo:
        name = todo.pop()
        if name in chosen:
            continue
        version, deps = db[name]
        chosen[name] = version
        for alt in deps:
            pick = next((c for c in alt.split("|") if c in db), None)
            if pick is not None and pick not in chosen:
                todo.append(pick)
    return dict(sorted(chosen.items()))


def recipe_hash(pkgs: dict[str, str]) -> str:
    h = hashlib.sha256(Path(__file__).read_bytes())
    h.update(json.dumps(pkgs, sort_keys=True).encode())
    return h.hexdigest()[:16]


def _canonical(path: str) -> str:
    """``/bin/sh`` on a merged-/usr machine is ``/usr/bin/sh``: the real directory, the same name."""
    head, tail = os.path.split(path)
    return os.path.join(os.path.realpath(head), tail)


#: files the image gets of its own, never the machine's
_WRITTEN = {"etc/passwd", "etc/group", "etc/ld.so.conf", "var/lib/dpkg/status"}


def _rootfs_tar(pkgs: dict[str, str], into: Path) -> None:
    listed = subprocess.run(["dpkg", "-L", *pkgs], capture_output=True, text=True, check=False).stdout
    paths = sorted({_canonical(p) for p in listed.splitlines() if p.startswith("/") and p != "/."})
    status = subprocess.run(["dpkg-query", "-s", *pkgs], capture_output=True, text=True, check=True).stdout
    seen: set[str] = set()
    with tarfile.open(into, "w") as tar:

        def add_dir(name: str, mode: int = 0o755) -> None:
            seen.add(name)
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)

        def add_text(name: str, text: str, mode: int = 0o644) -> None:
            seen.add(name)
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))

        for top in ("usr", "usr/bin", "usr/sbin", "usr/lib", "usr/lib64", "etc", "var", "var/lib", "var/lib/dpkg",
                    "root", "home", "opt", "proc", "sys", "dev", "run", "var/tmp"):  # fmt: skip
            add_dir(top, 0o700 if top == "root" else 0o755)
        add_dir("tmp", 0o1777)
        for link in ("bin", "sbin", "lib", "lib64"):
            if os.path.islink(f"/{link}"):
                info = tarfile.TarInfo(link)
                info.type, info.linkname = tarfile.SYMTYPE, os.readlink(f"/{link}")
                tar.addfile(info)
        for link in ("bin", "sbin", "lib", "lib64"):
            seen.add(link)
        for path in paths:
            arcname = path.lstrip("/")
            if not os.path.lexists(path) or arcname in seen or arcname in _WRITTEN:
                continue
            seen.add(arcname)
            info = tar.gettarinfo(path, arcname=arcname)
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            if info.isreg():
                with open(path, "rb") as fh:
                    tar.addfile(info, fh)
            elif info.isdir() or info.issym():
                tar.addfile(info)
        add_text("etc/passwd", "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
        add_text("etc/group", "root:x:0:\nnogroup:x:65534:\n")
        add_text("etc/ld.so.conf", "include /etc/ld.so.conf.d/*.conf\n")
        add_text("var/lib/dpkg/status", status if status.endswith("\n") else status + "\n")


def image_name(variant: Variant, digest: str) -> str:
    return f"{REPOSITORY}/{variant.name}:{digest}"


def _image_exists(ref: str) -> bool:
    return docker("image", "inspect", ref, timeout=30).returncode == 0


def build_images() -> dict[str, str]:
    """Every ``VARIANTS`` image, built when missing: variant name -> image reference. One build at a
    time on this machine (test workers ask at once)."""
    with _locked():
        return _build_images()


def _build_images() -> dict[str, str]:
    pkgs = packages()
    digest = recipe_hash(pkgs)
    refs = {v.name: image_name(v, digest) for v in VARIANTS}
    if all(_image_exists(ref) for ref in refs.values()):
        return refs
    with tempfile.TemporaryDirectory(prefix="crosshost-rootfs-") as tmp:
        base = Path(tmp) / "rootfs.tar"
        _rootfs_tar(pkgs, base)
        for v in VARIANTS:
            ref = refs[v.name]
            if _image_exists(ref):
                continue
            tar_path = Path(tmp) / f"{v.name}.tar"
            _variant_tar(base, v, tar_path)
            changes = [f"ENV {k}={val}" for k, val in v.env] + [
                f"LABEL crosshost.recipe={digest}", 'CMD ["sleep", "infinity"]', "WORKDIR /root",
            ]  # fmt: skip
            argv = ["image", "import"]
            for c in changes:
                argv += ["--change", c]
            res = docker(*argv, str(tar_path), ref, timeout=300)
            if res.returncode != 0:
                raise DockerError(f"docker import {ref} failed: {res.stderr.decode(errors='replace').strip()}")
            # ld.so.cache for the image's own libraries (run inside, so it sees only the image's files)
            cid = f"crosshost-ldconfig-{os.getpid()}"
            made = docker("run", "--name", cid, "--network", "none", ref, "/sbin/ldconfig", timeout=120)
            try:
                if made.returncode != 0:
                    raise DockerError(f"ldconfig in {ref} failed: {made.stderr.decode(errors='replace').strip()}")
                commit = ["commit"]
                for c in changes:
                    commit += ["--change", c]
                res = docker(*commit, cid, ref, timeout=120)
                if res.returncode != 0:
                    raise DockerError(f"docker commit {ref} failed: {res.stderr.decode(errors='replace').strip()}")
            finally:
                docker("rm", "-f", cid, timeout=60)
            check = docker("run", "--rm", "--network", "none", ref, "python3", "-c", "import json, tarfile, sqlite3", timeout=120)
            if check.returncode != 0:
                docker("image", "rm", "-f", ref, timeout=60)
                raise DockerError(f"{ref}: python3 does not run in it: {check.stderr.decode(errors='replace').strip()}")
    return refs


def _variant_tar(base: Path, variant: Variant, into: Path) -> None:
    with tarfile.open(base) as src, tarfile.open(into, "w") as out:
        for member in src:
            out.addfile(member, src.extractfile(member) if member.isreg() else None)
        made = {m.name for m in src.getmembers()}
        for path, text in variant.files:
            parts = path.split("/")
            for i in range(1, len(parts)):
                d = "/".join(parts[:i])
                if d not in made:
                    info = tarfile.TarInfo(d)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    out.addfile(info)
                    made.add(d)
            data = text.encode()
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), 0o644
            out.addfile(info, io.BytesIO(data))


def write_inventory(path: Path, refs: dict[str, str]) -> None:
    """``make demo-containers``'s inventory: this machine (the reference) and a container of each image."""
    lines = [
        "# written by tools/testdocker.py inventory: this machine and a container of each test image",
        "[defaults]",
        'env_allowlist = ["PATH", "LANG", "LC_ALL", "TZ"]',
        'workspace_root = "/tmp/crosshost"',
        f"docker_host = {json.dumps(DOCKER_HOST)}",
        "",
        "[[hosts]]",
        'name = "local"',
        'transport = "local"',
    ]
    for variant, ref in refs.items():
        lines += ["", "[[hosts]]", f"name = {json.dumps('img-' + variant.removeprefix('py-'))}",
                  'transport = "docker"', f"image = {json.dumps(ref)}"]  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["up", "down", "images", "status", "inventory"])
    parser.add_argument("path", nargs="?", type=Path, help="inventory: where to write hosts.toml")
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            started = up()
            build_images()
            print(f"dockerd {'started' if started else 'already running'} on {DOCKER_HOST}")
        elif args.command == "images":
            for name, ref in build_images().items():
                print(f"{name} {ref}")
        elif args.command == "inventory":
            if args.path is None:
                parser.error("inventory needs a PATH")
            write_inventory(args.path, build_images())
            print(f"wrote {args.path}")
        elif args.command == "status":
            print(f"dockerd on {DOCKER_HOST}: {'answering' if responding() else 'not answering'}")
        else:
            down()
    except DockerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
