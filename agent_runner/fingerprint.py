"""The host fingerprint: what a host is, as far as an agent run can tell, plus its isolation findings.

``fingerprint`` (16 hex) digests what describes the host as an agent run sees it: every field but
``captured_at``, ``cwd`` (a run's own path: two runs, or two inventory names for one machine, work in
different directories) and the machine identity. Environment values are never read into it, only
key names.

``machine_identity`` says which machine this is: a sha256 of ``/etc/machine-id`` and the kernel's
boot id, never the raw values (both identify the machine to anyone who sees them). Without a
machine-id it is the hash of the boot id alone and ``machine_identity_complete`` is false: every
container on one kernel shares that boot id, so a partial identity is never taken as "the same
machine". It is left out of the digest: the boot id changes at every reboot, and a reboot must not
read as a changed host.
"""

from __future__ import annotations

import hashlib
import json
import locale
import os
import shutil
import socket
import subprocess
import sys
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from . import isolation_probe, sandbox
from .records import Fingerprint
from .redact import redact_text, secret_env_keys

VERSION_TIMEOUT_S = 5
# Shell bookkeeping that says nothing about the host; left out so a fingerprint does not move with it.
_SHELL_NOISE_KEYS = {"_", "OLDPWD", "SHLVL", "PWD"}
#: fields the digest leaves out: its own, the capture time, the run's own path, which machine it is
NOT_DIGESTED = frozenset({"fingerprint", "captured_at", "cwd", "machine_identity", "machine_identity_complete"})
#: where the machine id lives (systemd's, then D-Bus's older copy); 32 hex, one line
MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")
BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"
_IDENTITY_FORMAT = b"crosshost machine identity v1\0"


def _read_id(paths: Sequence[str], hex_digits: int) -> Optional[str]:
    """The first of ``paths`` holding an id of ``hex_digits`` hex digits (dashes dropped), else None."""
    for path in paths:
        try:
            with open(path, "rb") as handle:
                text = handle.read(128).decode("ascii", "replace").strip().replace("-", "").lower()
        except OSError:
            continue
        if len(text) == hex_digits and all(c in "0123456789abcdef" for c in text):
            return text
    return None


def machine_identity(machine_id_files: Sequence[str] = MACHINE_ID_FILES,
                     boot_id_file: str = BOOT_ID_FILE) -> Tuple[Optional[str], bool]:
    """(the machine's identity, 32 hex, or None when neither id can be read; True when it was made
    from both the machine id and the boot id)."""
    machine_id = _read_id(machine_id_files, 32)
    boot_id = _read_id((boot_id_file,), 32)
    if machine_id is None and boot_id is None:
        return None, False
    text = f"machine-id={machine_id or ''}\0boot-id={boot_id or ''}".encode()
    return hashlib.sha256(_IDENTITY_FORMAT + text).hexdigest()[:32], machine_id is not None and boot_id is not None


def _filename_safe(*parts: str) -> str:
    """``platform``'s own formatting of its ``platform()`` string (``platform._platform``)."""
    text = "-".join(p.strip() for p in parts if p)
    for bad in ' /\\:;"()':
        text = text.replace(bad, "_" if bad == " " else "-")
    text = text.replace("unknown", "")
    while "--" in text:
        text = text.replace("--", "-")
    return text.rstrip("-")


def platform_facts() -> Tuple[str, str, str]:
    """(``platform.platform()``, ``platform.machine()``, ``"<python_implementation()>
    <python_version()>"``). On Linux with glibc and CPython made from ``os.uname()``, the C library's
    version and ``sys.version`` as ``platform`` makes them, without importing it (its import and its
    regular expressions were ~6 ms of every runner's start) or the ``uname -p`` it runs: on Linux that
    says ``unknown`` (GNU, BusyBox) or the machine (distributions that patch it), both of which
    ``platform`` leaves out. Anywhere else, ``platform`` itself."""
    name = os.uname()
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (AttributeError, ValueError, OSError):
        libc = ""
    version = sys.version.split(" ", 1)[0]
    simple = version.count(".") == 2 and all(c.isalnum() or c in ".+" for c in version)
    if name.sysname == "Linux" and len(libc.split()) == 2 and sys.implementation.name == "cpython" and simple:
        return (_filename_safe(name.sysname, name.release, name.machine, "with", "".join(libc.split(None, 1))),
                name.machine, f"CPython {version}")
    import platform

    return (platform.platform(), platform.machine(),
            f"{platform.python_implementation()} {platform.python_version()}")


def _version_of(command: str, env: Mapping[str, str]) -> Optional[str]:
    """``command --version``'s first line. It is found through the attempts' PATH (which explain may
    set to another host's) and run as the runner, so only when no one but root or the runner could
    have written it (``sandbox.trusted``): a program an attempt planted is named, never run."""
    path = shutil.which(command, path=env.get("PATH", os.defpath))
    if path is None:
        return None
    if not sandbox.trusted(path):
        return "unknown (not run: a user other than root or the runner may write it)"
    try:
        done = subprocess.run([path, "--version"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=VERSION_TIMEOUT_S, env=dict(env))
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    lines = done.stdout.decode("utf-8", "replace").strip().splitlines()
    return lines[0][:200] if lines else "unknown"


def _locale_facts(env: Mapping[str, str]) -> Dict[str, Any]:
    facts: Dict[str, Any] = {"LANG": env.get("LANG"), "LC_ALL": env.get("LC_ALL"),
                             "preferred_encoding": locale.getpreferredencoding(False)}
    try:
        saved = locale.setlocale(locale.LC_CTYPE)
        try:
            facts["resolved"] = locale.setlocale(locale.LC_CTYPE, "")
        finally:
            locale.setlocale(locale.LC_CTYPE, saved)
    except locale.Error as exc:
        facts["resolved"] = f"error: {exc}"
    return facts


def isolation_findings(env: Mapping[str, str], home: str, uid: Optional[int],
                       isolation: Optional[str] = None) -> List[Dict[str, str]]:
    """What makes this box dirty for an agent run; ``action`` is burn (do not use as is) or keep."""
    findings: List[Dict[str, str]] = []

    def add(kind: str, detail: str, action: str, meaning: str) -> None:
        findings.append({"kind": kind, "detail": detail, "action": action, "meaning": meaning})

    ssh_dir = os.path.join(home, ".ssh")
    if os.path.isdir(ssh_dir):
        add("ssh_dir", ssh_dir, "burn", "private keys are readable by an agent run as this user; "
            "use a user or box without ~/.ssh")
    config_dir = os.path.join(home, ".config")
    if os.path.isdir(config_dir):
        add("config_dir", config_dir, "keep", "tool configuration (and maybe tokens) is visible; "
            "the runner points HOME at an empty directory, so keep the box but check what is there")
    if isolation == sandbox.NONE:
        add("no_isolation", "attempts run beside the runner", "burn", "this host gives neither a PID "
            "namespace (unshare, user namespaces) nor a separate user to the runner: an agent can read "
            "the runner's environment and write its files; allow unprivileged user namespaces or run "
            "the runner as root (it then drops attempts to a uid of their own)")
    if os.path.exists("/var/run/docker.sock"):
        add("docker_socket", "/var/run/docker.sock", "burn", "the docker socket is root on the host; "
            "an agent could escape any workspace")
    for key in secret_env_keys(env):
        add("secret_env_key", key, "burn", f"{key} is visible in the environment; run the runner "
            f"through env -i with an allowlist (the runner refuses to start while it can see it)")
    if uid == 0:
        homes = []
        for base in ("/home", "/Users"):
            try:
                homes += [os.path.join(base, n) for n in os.listdir(base)]
            except OSError:
                continue
        if homes:
            add("root_with_user_homes", ", ".join(sorted(homes)[:5]), "burn", "running as root with "
                "other users' homes visible; use an unprivileged user or a box without them")
    return findings


def collect(cwd: Optional[str] = None, allowed_commands: Sequence[str] = (),
            env: Optional[Mapping[str, str]] = None, open_network: bool = False) -> Fingerprint:
    """The fingerprint of this host as seen from ``cwd`` (default: the process's working directory);
    ``open_network``: the suite lets attempts reach the network (no network namespace is tried)."""
    env = dict(os.environ if env is None else env)
    cwd = os.path.abspath(cwd or os.getcwd())
    home = os.path.expanduser("~")
    getuid = getattr(os, "getuid", None)
    uid = getuid() if getuid else None
    now = time.localtime()
    isolation = isolation_probe.detect(network=not open_network)
    if isolation == sandbox.PIDNS_UID and not sandbox.reachable_by_others(os.path.join(cwd, "x")):
        isolation = sandbox.PIDNS  # attempts under cwd cannot be reached by another uid (what they get)
    isolation = sandbox.level_name(isolation, not open_network and isolation_probe.detect_network(isolation))
    home_norm = home.rstrip("/")
    system, machine, python = platform_facts()
    data: Dict[str, Any] = {
        "hostname": socket.gethostname(),
        "platform": system,
        "machine": machine,
        "python": python,
        "python_executable": sys.executable,
        "cwd": cwd,
        "cwd_exists": os.path.isdir(cwd),
        "cwd_fs": filesystem_of(cwd),
        "user_home_in_cwd": bool(home_norm) and (cwd == home_norm or cwd.startswith(home_norm + "/")),
        "env_keys": sorted(k for k in env if k not in _SHELL_NOISE_KEYS),
        # the PATH attempts start from (when the allowlist passes it): which python3 or jq they meet
        "path": redact_text(env["PATH"]) if "PATH" in env else None,
        "has_local_dotenv": os.path.isfile(os.path.join(cwd, ".env")),
        "cpu_count": os.cpu_count(),
        "locale": _locale_facts(env),
        "tz": {"TZ": env.get("TZ"), "tzname": list(time.tzname), "utc_offset_s": now.tm_gmtoff},
        "uid": uid,
        "home": home,
        "tool_versions": {c: _version_of(c, env) for c in sorted(set(allowed_commands))},
        "isolation": isolation,
        "findings": isolation_findings(env, home, uid, isolation),
    }
    data["fingerprint"] = digest(data)
    data["machine_identity"], data["machine_identity_complete"] = machine_identity()
    data["captured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return Fingerprint.from_json(data)


def filesystem_of(path: str) -> Optional[str]:
    """The type of the file system ``path`` is on, as this process's mount namespace has it (the last
    mount at the deepest mount point above it in ``/proc/self/mountinfo``); None where that cannot be read."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    path = os.path.realpath(path)
    deepest, found = -1, None
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields, types = left.split(), right.split()
        if not sep or len(fields) < 5 or not types:
            continue
        point = fields[4]
        for escaped, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
            point = point.replace(escaped, char)
        if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= deepest:
            deepest, found = len(point), types[0]
    return found


def digest(data: Mapping[str, Any]) -> str:
    stable = {k: v for k, v in data.items() if k not in NOT_DIGESTED}
    return hashlib.sha256(json.dumps(stable, sort_keys=True).encode()).hexdigest()[:16]


def commands_of(policy: Mapping[str, Sequence[Sequence[str]]]) -> List[str]:
    """The program names a tools.json policy allows (whose versions the fingerprint records)."""
    return sorted({os.path.basename(entry[0]) for entry in policy.get("allow", []) if entry})
