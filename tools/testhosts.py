#!/usr/bin/env python3
"""Real sshd test hosts on 127.0.0.1, each in its own UTS + mount namespace (stdlib only).

    python tools/testhosts.py up --count 2 --base-port 2222 --state /var/tmp/crosshost-hosts
    python tools/testhosts.py down --state /var/tmp/crosshost-hosts

Each host gets its own hostname and its own /root, /tmp and /opt (bind-mounted from its state
directory, which lives outside the bound paths), its own /etc/machine-id (so each is a machine of
its own to crosshost's machine identity; two inventory names for one host are one machine), a
generated ed25519 host key, and the fleet's client key in its authorized_keys. The fleet owns a known_hosts (``[127.0.0.1]:PORT key``) and can
write an inventory for any set of its hosts. Tests import ``Fleet`` for the destructive operations
(kill a host with all its sessions, start late, change the host key).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

SSHD = "/usr/sbin/sshd"
HOST_NAME_LETTERS = "abcdefghijklmnopqrstuvwxyz"
MACHINE_ID = Path("/etc/machine-id")

SSHD_CONFIG = """\
Port {port}
ListenAddress 127.0.0.1
HostKey {dir}/hostkey
AuthorizedKeysFile {dir}/authorized_keys /home/%u/.ssh/authorized_keys
LogLevel {log_level}
PidFile {dir}/sshd.pid
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
StrictModes no
UsePAM no
AllowTcpForwarding yes
AllowAgentForwarding yes
X11Forwarding no
PrintMotd no
Subsystem sftp internal-sftp
"""


class TestHostError(RuntimeError):
    """A test host could not be started or stopped; the message says why (with sshd.log's tail)."""

    __test__ = False  # not a pytest test class, despite the name


def default_names(count: int) -> list[str]:
    """box-a ... box-z, then box-aa, box-ab, ... (a fleet of 32 hosts needs more than 26 names)."""
    letters = HOST_NAME_LETTERS
    return [f"box-{letters[i]}" if i < 26 else f"box-{letters[i // 26 - 1]}{letters[i % 26]}" for i in range(count)]


def free_port() -> int:
    """A port nothing listens on right now (the kernel's choice; a small race is acceptable here)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports nothing listens on right now (all bound at once, then released)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(count)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]


def _run(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise TestHostError(f"{shlex.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")


def _keygen(path: Path, comment: str) -> None:
    for p in (path, path.with_name(path.name + ".pub")):
        p.unlink(missing_ok=True)
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])


def port_is_free(port: int) -> bool:
    """Nothing listens on 127.0.0.1:``port`` (bound as sshd binds it: TIME_WAIT leftovers don't count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def pick_port(prefer: int | None = None) -> int:
    """``prefer`` when it is free, else a port the kernel picks (``make demo`` when 2222 is taken)."""
    return prefer if prefer is not None and port_is_free(prefer) else free_port()


def up_ports(count: int, base: int | None) -> list[int]:
    """``base``, ``base + 1``, ... when a base is given (a taken one fails when its host starts), else
    2222, 2223, ... each where free and a port the kernel picks where not, never one port twice."""
    if base is not None:
        return [base + i for i in range(count)]
    ports: list[int] = []
    for i in range(count):
        port = pick_port(2222 + i)
        while port in ports:
            port = free_port()
        ports.append(port)
    return ports


def _require_free_port(name: str, port: int) -> None:
    if not port_is_free(port):
        raise TestHostError(
            f"{name}: port {port} on 127.0.0.1 is in use; "
            "stop whatever holds it (e.g. `make hosts-down`) and retry, or pick another port"
        )


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # after "pid (comm)", which may contain spaces
    return fields[19] if len(fields) > 19 else None


def _uts_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/uts")
    except OSError:
        return None


@dataclass
class TestHost:
    __test__ = False  # not a pytest test class, despite the name

    name: str
    port: int
    dir: Path
    #: the login user the inventory uses ("root", or one made by ``Fleet.create(user=...)``)
    user: str = "root"

    @property
    def log(self) -> Path:
        return self.dir / "sshd.log"

    @property
    def hostkey_pub(self) -> Path:
        return self.dir / "hostkey.pub"

    @property
    def known_hosts_name(self) -> str:
        return f"[127.0.0.1]:{self.port}"

    def known_hosts_line(self, label: str | None = None) -> str:
        key_type, key_b64 = self.hostkey_pub.read_text().split()[:2]
        return f"{label or self.known_hosts_name} {key_type} {key_b64}\n"

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no sshd.log)"

    @property
    def _ns_pid_file(self) -> Path:
        return self.dir / "unshare.pid"

    def ns_pid(self) -> int | None:
        """The pid of the `unshare` process that holds this host's namespaces, if it still runs.

        The pid file also holds the process's start time: a pid reused by another process (say, in
        another fleet's host) after this host died is not taken for this host's."""
        try:
            pid_text, _, started = self._ns_pid_file.read_text().partition(" ")
            pid = int(pid_text)
        except (OSError, ValueError):
            return None
        if started.strip() and _start_time(pid) != started.strip():
            return None
        return pid if _uts_ns(pid) is not None else None

    def is_running(self) -> bool:
        return self.ns_pid() is not None


class Fleet:
    """A set of test hosts sharing one state directory, client key and known_hosts."""

    def __init__(
        self,
        state: Path,
        *,
        identity: Path | None = None,
        known_hosts: Path | None = None,
    ) -> None:
        self.state = Path(state).resolve()
        meta = self._read_meta()
        self.identity = Path(identity or meta.get("identity") or self.state / "id_ed25519").resolve()
        self.known_hosts = Path(known_hosts or meta.get("known_hosts") or self.state / "known_hosts").resolve()
        users = meta.get("users", {})
        self.hosts: dict[str, TestHost] = {
            name: TestHost(name, int(port), self.state / "hosts" / name, users.get(name, "root"))
            for name, port in meta.get("hosts", {}).items()
        }

    # -- bookkeeping -------------------------------------------------------------------------
    @property
    def _meta_path(self) -> Path:
        return self.state / "fleet.json"

    def _read_meta(self) -> dict:
        try:
            return dict(json.loads(self._meta_path.read_text()))
        except (OSError, ValueError):
            return {}

    def _write_meta(self) -> None:
        self.state.mkdir(parents=True, exist_ok=True)
        meta = {
            "identity": str(self.identity),
            "known_hosts": str(self.known_hosts),
            "hosts": {h.name: h.port for h in self.hosts.values()},
            "users": {h.name: h.user for h in self.hosts.values() if h.user != "root"},
        }
        self._meta_path.write_text(json.dumps(meta, indent=2) + "\n")

    def _ensure_client_key(self) -> None:
        if not self.identity.exists():
            self.identity.parent.mkdir(parents=True, exist_ok=True)
            _keygen(self.identity, "crosshost-test-client")
            self.identity.chmod(0o600)

    # -- hosts -------------------------------------------------------------------------------
    def create(
        self,
        name: str,
        port: int,
        *,
        trust: bool = True,
        user: str | None = None,
        etc_hosts: dict[str, str] | None = None,
        log_level: str = "INFO",
    ) -> TestHost:
        """Prepare a host's state directory (keys, config, private dirs); does not start it.

        ``user``: a non-root login user that exists only inside this host (its own /etc/passwd,
        /etc/shadow, /etc/group and /home, bound over the machine's), holding the fleet's key.
        ``etc_hosts``: names only this host resolves (its own /etc/hosts), e.g. a target behind it.
        ``log_level``: sshd's LogLevel (DEBUG1 logs each direct-tcpip channel a jump host opens).
        """
        if not name or not all(c.isalnum() or c in "-." for c in name):
            raise TestHostError(f"bad host name {name!r}")
        if shutil.which("ssh-keygen") is None or not Path(SSHD).exists():
            raise TestHostError(f"{SSHD} or ssh-keygen missing: apt-get install openssh-server openssh-client")
        self._ensure_client_key()
        host = TestHost(name, port, self.state / "hosts" / name, user or "root")
        for sub in ("root", "tmp", "opt", "home", "etc"):
            (host.dir / sub).mkdir(parents=True, exist_ok=True)
        (host.dir / "tmp").chmod(0o1777)
        _keygen(host.dir / "hostkey", f"crosshost-test-{name}")
        shutil.copyfile(self.identity.with_name(self.identity.name + ".pub"), host.dir / "authorized_keys")
        if user is not None:
            _make_user(host.dir, user, self.identity.with_name(self.identity.name + ".pub"))
        hosts_file = Path("/etc/hosts").read_text() if Path("/etc/hosts").exists() else ""
        hosts_file += "".join(f"{addr} {alias}\n" for alias, addr in (etc_hosts or {}).items())
        (host.dir / "etc" / "hosts").write_text(hosts_file)
        own_id = host.dir / "etc" / "machine-id"
        if not own_id.exists():  # kept across restarts: the same host stays the same machine
            own_id.write_text(uuid.uuid4().hex + "\n")
        (host.dir / "sshd_config").write_text(SSHD_CONFIG.format(port=port, dir=host.dir, log_level=log_level))
        self.hosts[name] = host
        self._write_meta()
        if trust:
            self.trust(name)
        return host

    def start(self, name: str, *, delay_s: float = 0.0, wait: bool = True, wait_s: float = 15.0) -> TestHost:
        """Start a host's sshd in fresh namespaces; ``delay_s`` makes sshd appear that much later."""
        host = self.hosts[name]
        if host.is_running():
            raise TestHostError(f"{name}: already running")
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege-separation dir
        _run([SSHD, "-t", "-f", str(host.dir / "sshd_config")])
        # Another sshd on the port would answer wait_ready's banner check in our place.
        _require_free_port(name, host.port)
        d = shlex.quote(str(host.dir))
        script = (
            f"{'sleep ' + repr(float(delay_s)) + ';' if delay_s > 0 else ''}"
            f"hostname {shlex.quote(name)} && "
            f"mount --bind {d}/root /root && mount --bind {d}/tmp /tmp && mount --bind {d}/opt /opt && "
            f"mount --bind {d}/home /home && mount --bind {d}/etc/hosts /etc/hosts && "
            # without a machine-id on this machine there is nothing to bind over: the hosts then
            # have a partial identity (the boot id alone), which never says "the same machine"
            f"{f'mount --bind {d}/etc/machine-id /etc/machine-id && ' if MACHINE_ID.exists() else ''}"
            f"{_bind_user_files(host.dir)}"
            f"exec {SSHD} -D -f {d}/sshd_config -E {d}/sshd.log"
        )
        host.log.unlink(missing_ok=True)
        with open(host.dir / "unshare.err", "wb") as err:
            proc = subprocess.Popen(
                ["setsid", "unshare", "--uts", "--mount", "--fork", "sh", "-c", script],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                close_fds=True,
            )
        (host.dir / "unshare.pid").write_text(f"{proc.pid} {_start_time(proc.pid) or ''}\n")
        if wait:
            self.wait_ready(name, timeout_s=wait_s + delay_s, proc=proc)
        return host

    def wait_ready(self, name: str, *, timeout_s: float = 15.0, proc: subprocess.Popen | None = None) -> None:
        """Return once the port accepts a connection and sends an SSH banner; raise otherwise."""
        host = self.hosts[name]
        deadline = time.monotonic() + timeout_s
        last = "no attempt"
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                err = (host.dir / "unshare.err").read_text(errors="replace").strip()
                raise TestHostError(
                    f"{name}: sshd exited ({proc.returncode}) on port {host.port}: {err}\n{host.log_tail()}"
                )
            try:
                with socket.create_connection(("127.0.0.1", host.port), timeout=1.0) as s:
                    s.settimeout(2.0)
                    banner = s.recv(64)
                if banner.startswith(b"SSH-2.0-"):
                    return
                last = f"unexpected banner {banner!r}"
            except OSError as exc:
                last = str(exc)
            time.sleep(0.1)
        raise TestHostError(f"{name}: no SSH banner on 127.0.0.1:{host.port} after {timeout_s:g}s ({last})\n"
                            f"{host.log_tail()}")

    def kill(self, name: str) -> None:
        """Kill sshd and every session of the host: all processes in its UTS namespace.

        The namespace is held open (a descriptor on ``/proc/<pid>/ns/uts``) until the last of its
        processes is gone. A namespace's inode number is freed when it dies and the kernel hands it
        to the next namespace created, e.g. by a test host starting meanwhile: without the hold, a
        second pass would match, and kill, that unrelated host.
        """
        host = self.hosts[name]
        pid = host.ns_pid()
        if pid is None:
            return
        try:
            ns_fd = os.open(f"/proc/{pid}/ns/uts", os.O_RDONLY)
        except OSError:  # it has just exited
            (host.dir / "unshare.pid").unlink(missing_ok=True)
            return
        try:
            ns = f"uts:[{os.fstat(ns_fd).st_ino}]"  # what readlink(/proc/<pid>/ns/uts) says
            if ns == _uts_ns(os.getpid()) or ns == _uts_ns(1):
                # A recycled pid outside any test namespace: killing "its namespace" would kill the machine.
                (host.dir / "unshare.pid").unlink(missing_ok=True)
                return
            for _ in range(50):
                victims = [p for p in _all_pids() if _uts_ns(p) == ns]
                if not victims:
                    break
                for p in victims:
                    _kill_if_in(p, ns)
                _reap(pid)
                time.sleep(0.05)
            else:
                raise TestHostError(f"{name}: processes survive SIGKILL: {victims}")
        finally:
            os.close(ns_fd)
        (host.dir / "unshare.pid").unlink(missing_ok=True)

    def regenerate_host_key(self, name: str) -> None:
        """Give the host a new host key (restarting it if it runs); known_hosts keeps the old one."""
        host = self.hosts[name]
        running = host.is_running()
        if running:
            self.kill(name)
        _keygen(host.dir / "hostkey", f"crosshost-test-{name}")
        if running:
            self.start(name)

    def trust(self, name: str, label: str | None = None) -> None:
        """Record the host's current key in the fleet's known_hosts (replacing any older entry);
        ``label``: under another name than ``[127.0.0.1]:PORT`` (as a jump host's target is known)."""
        if label is None:
            self.forget(name)
        self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
        with self.known_hosts.open("a") as f:
            f.write(self.hosts[name].known_hosts_line(label))

    def authorize(self, name: str, public_key: Path) -> None:
        """Let ``public_key`` log in to the host too (as root and as its own user)."""
        host = self.hosts[name]
        line = Path(public_key).read_text()
        targets = [host.dir / "authorized_keys"]
        if host.user != "root":
            targets.append(host.dir / "home" / host.user / ".ssh" / "authorized_keys")
        for path in targets:
            with path.open("a") as f:
                f.write(line if line.endswith("\n") else line + "\n")

    def forget(self, name: str) -> None:
        """Remove the host's entries from the fleet's known_hosts (its key becomes unknown)."""
        host = self.hosts[name]
        try:
            lines = self.known_hosts.read_text().splitlines(keepends=True)
        except FileNotFoundError:
            return
        keep = [ln for ln in lines if ln.split(" ", 1)[0] != host.known_hosts_name]
        self.known_hosts.write_text("".join(keep))

    def remove(self, name: str) -> None:
        """Stop the host and delete its state."""
        self.kill(name)
        self.forget(name)
        host = self.hosts.pop(name)
        shutil.rmtree(host.dir, ignore_errors=True)
        self._write_meta()

    def up(self, names: list[str], ports: list[int], *, user: str | None = None) -> list[TestHost]:
        hosts = []
        try:
            for name, port in zip(names, ports, strict=True):
                self.create(name, port, user=user)
                hosts.append(self.start(name))
        except BaseException:
            self.down()
            raise
        return hosts

    def down(self) -> None:
        for name in list(self.hosts):
            self.kill(name)

    # -- inventory ---------------------------------------------------------------------------
    def write_inventory(
        self,
        path: Path,
        names: list[str] | None = None,
        *,
        include_local: bool = True,
        connect_timeout_s: float | None = None,
        extra_defaults: dict[str, object] | None = None,
    ) -> Path:
        """Write a hosts.toml for ``names`` (default: every host), optionally with ``local`` first."""
        path = Path(path)
        names = list(self.hosts) if names is None else names
        lines = ["# written by tools/testhosts.py", "[defaults]"]
        lines.append(f"known_hosts = {_toml_str(str(self.known_hosts))}")
        if connect_timeout_s is not None:
            lines.append(f"connect_timeout_s = {connect_timeout_s}")
        for key, value in (extra_defaults or {}).items():
            lines.append(f"{key} = {json.dumps(value)}")
        if include_local:
            lines += ["", "[[hosts]]", 'name = "local"', 'transport = "local"']
            if "workspace_root" not in (extra_defaults or {}):
                # The fleet's own root: the default /tmp/crosshost is shared by every fleet on this
                # machine, and "nothing left behind" must see only this fleet's runs.
                lines.append(f"workspace_root = {_toml_str(str(self.state / 'local-root'))}")
        for name in names:
            host = self.hosts[name]
            lines += [
                "",
                "[[hosts]]",
                f"name = {_toml_str(name)}",
                'transport = "ssh"',
                'address = "127.0.0.1"',
                f"port = {host.port}",
                f"user = {_toml_str(host.user)}",
                f"identity_file = {_toml_str(str(self.identity))}",
            ]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
        return path


_PORT_LINE = re.compile(r"^port = \d+[ \t]*$", re.M)
_PATH_LINE = re.compile(r'^((?:known_hosts|identity_file) = )"([^"]*)"', re.M)


def retarget_inventory(source: Path, port: int, out: Path) -> Path:
    """Write ``source`` (an inventory with one ssh host) to ``out`` with that host's port replaced and
    its relative key paths made absolute, so ``out`` reaches the same files from wherever it lives."""
    text = source.read_text()
    if len(_PORT_LINE.findall(text)) != 1:
        raise TestHostError(f"{source}: expected exactly one 'port = N' line to replace")
    base = source.resolve().parent
    text = _PORT_LINE.sub(f"port = {port}", text)
    text = _PATH_LINE.sub(lambda m: m.group(1) + _toml_str(str((base / m.group(2)).resolve())), text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return out


def _free_id() -> int:
    taken = set()
    for name in ("/etc/passwd", "/etc/group"):
        for line in Path(name).read_text().splitlines():
            fields = line.split(":")
            if len(fields) > 2 and fields[2].isdigit():
                taken.add(int(fields[2]))
    return next(i for i in range(2000, 60000) if i not in taken)


def _make_user(host_dir: Path, user: str, public_key: Path) -> None:
    """passwd/shadow/group files that add ``user`` to the machine's, and its home with the key."""
    if not user.isidentifier() or user == "root":
        raise TestHostError(f"bad user name {user!r}")
    uid = _free_id()
    etc = host_dir / "etc"
    (etc / "passwd").write_text(Path("/etc/passwd").read_text() + f"{user}:x:{uid}:{uid}::/home/{user}:/bin/sh\n")
    (etc / "group").write_text(Path("/etc/group").read_text() + f"{user}:x:{uid}:\n")
    # "*": no password, but not locked ("!"), so sshd lets the key in with UsePAM no
    shadow = (etc / "shadow")
    shadow.write_text(Path("/etc/shadow").read_text() + f"{user}:*:19000:0:99999:7:::\n")
    shadow.chmod(0o640)
    ssh_dir = host_dir / "home" / user / ".ssh"
    ssh_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(public_key, ssh_dir / "authorized_keys")
    for path in (ssh_dir.parent, ssh_dir, ssh_dir / "authorized_keys"):
        os.chown(path, uid, uid)
    (host_dir / "user").write_text(user)


def _bind_user_files(host_dir: Path) -> str:
    if not (host_dir / "user").exists():
        return ""
    d = shlex.quote(str(host_dir))
    return " && ".join(f"mount --bind {d}/etc/{f} /etc/{f}" for f in ("passwd", "shadow", "group")) + " && "


def _toml_str(s: str) -> str:
    return json.dumps(s)  # a JSON string is a valid TOML basic string


def _all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _kill_if_in(pid: int, ns: str) -> None:
    """SIGKILL ``pid`` if it is (still) in namespace ``ns``: a pidfd pins the process while its
    namespace is checked, so a pid that exited and was reused meanwhile is never signalled."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:  # already gone
        return
    try:
        if _uts_ns(pid) == ns:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    finally:
        os.close(pidfd)


def _reap(pid: int) -> None:
    """Collect the unshare process if it is our child (tests start hosts in-process)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="testhosts", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start test hosts")
    up.add_argument("--count", type=int, default=2)
    up.add_argument("--names", help="comma-separated host names (default box-a, box-b, ...)")
    up.add_argument("--base-port", type=int,
                    help="the first host's port, the next host's one more (default: 2222, 2223, ... where "
                         "free, else ports the kernel picks)")
    up.add_argument("--state", type=Path, default=Path("/var/tmp/crosshost-hosts"))
    up.add_argument("--identity-out", type=Path, help="where the client key goes (default STATE/id_ed25519)")
    up.add_argument("--known-hosts-out", type=Path, help="the known_hosts to write (default STATE/known_hosts)")
    up.add_argument("--inventory-out", type=Path, help="the inventory to write (default STATE/hosts.toml)")
    up.add_argument("--no-local", action="store_true", help="leave the local host out of the inventory")
    port = sub.add_parser("free-port", help="print a free port on 127.0.0.1 (--prefer it when it is free)")
    port.add_argument("--prefer", type=int, help="the port to print when nothing listens on it")
    retarget = sub.add_parser("retarget", help="copy an inventory with its ssh host's port replaced")
    retarget.add_argument("source", type=Path)
    retarget.add_argument("port", type=int)
    retarget.add_argument("out", type=Path)
    up.add_argument("--user", help="log in as this non-root user (made inside each host) instead of root")
    down = sub.add_parser("down", help="stop the test hosts of a state directory")
    down.add_argument("--state", type=Path, default=Path("/var/tmp/crosshost-hosts"))
    args = parser.parse_args(argv)

    if args.cmd == "free-port":
        print(pick_port(args.prefer))
        return 0
    try:
        if args.cmd == "retarget":
            retarget_inventory(args.source, args.port, args.out)
            return 0
        if args.cmd == "down":
            fleet = Fleet(args.state)
            fleet.down()
            print(f"stopped {len(fleet.hosts)} test host(s) of {fleet.state}")
            return 0
        names = args.names.split(",") if args.names else default_names(args.count)
        fleet = Fleet(args.state, identity=args.identity_out, known_hosts=args.known_hosts_out)
        fleet.down()  # a second `up` replaces the previous fleet instead of colliding with it
        for name in list(fleet.hosts):
            if name not in names:
                fleet.remove(name)
        hosts = fleet.up(names, up_ports(len(names), args.base_port), user=args.user)
        inventory = fleet.write_inventory(
            args.inventory_out or fleet.state / "hosts.toml", include_local=not args.no_local
        )
    except TestHostError as exc:
        print(f"testhosts: error: {exc}", file=sys.stderr)
        return 1
    for h in hosts:
        print(f"{h.name}: {h.user}@127.0.0.1 -p {h.port} -i {fleet.identity}")
    print(f"known_hosts: {fleet.known_hosts}")
    print(f"inventory: {inventory}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
