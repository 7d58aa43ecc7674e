"""Commands crosshost runs on a host, built in one place and quoted with shlex.

The runner's environment is built here, never by SSH environment passing (sshd's ``AcceptEnv``
drops it silently): ``env -i`` empties it, then each allowlisted key gets either the value the
inventory pins or the host's OWN value, expanded by the host's shell (``${PATH+"PATH=$PATH"}``
passes PATH only when the host has it). Pinned values are never part of a command line (``ps`` on
the host shows every command line to every user): they travel in a file of the workspace's private
``in/`` directory (``pins_text``, put there by ``Workspace.put_pins``), which a shell between
``env -i`` and the runner reads with ``.`` and the run removes after use. Nothing of the
controller's environment is ever part of a command.
"""

from __future__ import annotations

import binascii
import posixpath
import re
import shlex
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.hosts.transport.base import ExecResult

_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

q = shlex.quote


def _check_key(key: str) -> str:
    if not _ENV_KEY.match(key):
        raise ValueError(f"env_allowlist: {key!r} is not an environment variable name")
    return key


def env_assignments(allowlist: Sequence[str], pinned: Collection[str] = ()) -> str:
    """The ``K=$K`` words after ``env -i`` for the keys not ``pinned``, for the host's shell to expand."""
    return " ".join(f'${{{key}+"{key}=${key}"}}' for key in map(_check_key, allowlist) if key not in pinned)


#: sources the pins file ($1) with every assignment exported, then runs the rest of its arguments
#: (each its own word: ``kill_script`` finds the launcher by one of them). The program ($2) is looked
#: up BEFORE the pins are read: a pinned PATH (an inventory's, or explain's counterfactual of another
#: host's) is the attempts' PATH, never the one the runner's interpreter is found through. The shell
#: exports a PWD of its own: dropped unless the allowlist passes one.
_SOURCE_PINS = (
    'c=$(command -v "$2") || { echo "crosshost: $2: not found on the host\'s PATH" >&2; exit 127; }; '
    'set -a && . "$1" && set +a && {unset}shift 2 && exec "$c" "$@"'
)


#: how crosshost starts every Python on a host: ``-I``, so nothing an attempt's uid could have left
#: (a user site-packages, ``PYTHON*`` variables, the working directory) is imported by the next run,
#: and ``-S``: not even the host's own site-packages, whose ``.pth`` files run code at every start
#: (what crosshost runs there is the standard library only; a bare start here: 16 -> 10 ms CPU)
PYTHON_FLAGS = ("-I", "-S")
#: a helper run from text (``-c``) also writes no bytecode
HELPER_FLAGS = " ".join((*PYTHON_FLAGS, "-B"))


def runner_argv(python: str, runner: str, args: Sequence[str]) -> list[str]:
    """The runner's own command line on a host (``PYTHON_FLAGS``)."""
    return [python, *PYTHON_FLAGS, runner, *args]


def clean_env_command(
    allowlist: Sequence[str], argv: Sequence[str], *, pinned: Collection[str] = (), pins_file: str | None = None
) -> str:
    """``env -i <allowlisted> argv...`` as shell text; the ``pinned`` keys' values come from
    ``pins_file`` (``pins_text``), read by a shell that then becomes ``argv``."""
    if pinned and pins_file is None:
        raise ValueError("pinned values need a pins file: they never go on a command line")
    if pinned:
        source = _SOURCE_PINS.replace("{unset}", "" if "PWD" in allowlist else "unset PWD && ")
        argv = ["sh", "-c", source, "crosshost-pins", pins_file or "", *argv]
    return " ".join(w for w in ("env -i", env_assignments(allowlist, pinned), shlex.join(argv)) if w)


#: the workspace's private directory (700): what the controller hands the runner, never pulled home
PRIVATE_DIR = "in"


def pins_path(workspace: str) -> str:
    """Where a run's pinned values wait for its runner: ``<workspace>/in/pins.env``."""
    return posixpath.join(workspace, PRIVATE_DIR, "pins.env")


def pins_text(pinned: Mapping[str, str]) -> str:
    """The pins file: one ``K='value'`` line each, quoted so the shell reading it runs nothing of a value."""
    return "".join(f"{_check_key(key)}={q(value)}\n" for key, value in pinned.items())


#: the run script's last stdout line: ``<marker> <bytes of out.tar>``, ``<marker> <bytes> inline`` (the
#: archive is in the lines above it, after ``INLINE_MARKER``), ``<marker> <bytes> inline removed`` (and
#: the same exec then removed the workspace: ``run_script``'s ``remove``) or ``<marker> none``
OUT_TAR_MARKER = "crosshost-out-tar"
#: the line before an archive sent in the run's own output, base64 (a character no base64 line has)
INLINE_MARKER = "crosshost-out-tar-base64"
#: an archive up to this size comes home in the run's own output: no transfer session of its own (an
#: SFTP server started on the host, its channel, the client's round trips), a third of what a host's
#: results cost to bring home at a fleet's scale; a larger one, or a host without ``base64``, is fetched
INLINE_MAX_BYTES = 4 << 20


def run_script(
    workspace: str,
    allowlist: Sequence[str],
    pinned: Collection[str],
    argv: Sequence[str],
    kill_after_s: int,
    *,
    fingerprint: str | None = None,
    refused: tuple[int, str] | None = None,
    inline_max: int | None = None,
    remove: str | None = None,
) -> str:
    """The runner's command line: in its workspace, under ``timeout -s KILL``, with a clean env (the
    ``pinned`` keys' values from the workspace's pins file, removed once the runner and the fallback
    fingerprint are done); then, in the same exec, ``out/`` packed as ``out.tar`` and its size
    printed (``split_out_tar``); an archive of at most ``inline_max`` bytes (default ``INLINE_MAX_BYTES``)
    is printed too, as base64.

    ``timeout`` puts itself and the runner in a new process group; its pid (= the group id) is
    written to ``pid`` so an interrupted run can be killed as a whole (``kill_script``). The packing
    runs in this outer shell, outside that group: it happens when the runner fails, is killed by the
    timeout or by Ctrl-C alike. ``fingerprint`` (shell text) runs only when the runner wrote no
    ``out/fingerprint.json`` (it writes one before its first task), so a host is described even when
    its runner stopped before that. Exits with the runner's status.

    ``refused``: (the exit of a runner whose start refused its bundle, shell text run then): such a
    runner wrote nothing, so nothing more runs (no fallback fingerprint from that bundle, no packing);
    the text runs, ``REFUSED_MARKER`` is printed and the exit is that status (``bundle_refused``).

    ``remove``: the workspace's removal (``Workspace.removal_script``), run in this exec once the whole
    archive went out in its output (nothing of the workspace is needed after that): the host's last
    exec of the run is spared. ``removed`` on the marker line says it exited 0 (the workspace was this
    run's, and nothing of it is left); otherwise nothing is said, and the removal is asked for again,
    in an exec of its own, which says why it fails.
    """
    command = clean_env_command(allowlist, argv, pinned=pinned, pins_file=pins_path(workspace))
    # nothing pinned: no pins file was written, and no exec of rm is spent on it
    unpin = f"rm -f {q(pins_path(workspace))}" if pinned else ""
    launch = f"echo $$ > pid && exec timeout -s KILL {int(kill_after_s)} {command}"
    lines = [f"cd {q(workspace)} || exit 1", f"sh -c {q(launch)}", "rc=$?"]
    if refused is not None:
        code, then = refused
        lines.append(
            f"if test $rc = {int(code)} && ! test -e out/fingerprint.json; then {unpin + '; ' if unpin else ''}"
            f"{then}; echo {REFUSED_MARKER}; exit {int(code)}; fi"
        )
    if fingerprint:
        lines.append(
            f"test -s out/fingerprint.json || {{ sh -c {q(fingerprint)} > out/.fingerprint.json 2>/dev/null "
            "&& mv out/.fingerprint.json out/fingerprint.json; rm -f out/.fingerprint.json; }"
        )
    if unpin:
        lines.append(unpin)
    lines.append(
        f"if test -d out && tar -C out -cf out.tar . 2>/dev/null; then s=$(wc -c < out.tar); else s=none; fi; i=; "
        f'if test "$s" != none && test "$s" -le {INLINE_MAX_BYTES if inline_max is None else int(inline_max)} && command -v base64 >/dev/null 2>&1; '
        f"then echo; echo {INLINE_MARKER}; base64 < out.tar && i=inline; fi; "
        + (f"if test \"$i\" = inline && cd / && ( {remove} ) >/dev/null 2>&1; then i='inline removed'; fi; "
           if remove else "")
        + f"echo; echo {OUT_TAR_MARKER} $s $i; exit $rc"
    )
    return "\n".join(lines)


#: ``run_script``'s stdout when the runner's start refused its bundle
REFUSED_MARKER = "crosshost-bundle-refused"


def bundle_refused(result: ExecResult, code: int) -> bool:
    """The run exec of ``run_script(refused=(code, ...))`` ended because the runner refused its bundle."""
    return result.exit_code == code and REFUSED_MARKER in result.stdout.split()


@dataclass(frozen=True)
class OutTar:
    """What ``run_script``'s exec said of ``out.tar``: ``size`` as the host printed it (None: no marker,
    e.g. the exec was cut off; "none": no archive; else its size in bytes, as text), and the archive
    itself when it came in the output (``inline``: the host's bytes, checked like fetched ones);
    ``removed``: the same exec removed the workspace after it (``run_script``'s ``remove``), so there is
    nothing left there to fetch or remove."""

    size: str | None
    inline: bytes | None = None
    removed: bool = False


def split_out_tar(stdout: str) -> tuple[str, OutTar]:
    """``run_script``'s stdout without its marker line and inline archive, and what they said. An
    inline archive that does not decode to the size printed is dropped: the archive is fetched. Text
    of a base64 that failed part of the way (no ``inline`` said) is dropped too, never the runner's."""
    head, sep, last = stdout.rstrip("\n").rpartition("\n")
    if not sep:
        head, last = "", stdout.rstrip("\n")
    words = last.split()
    if len(words) < 2 or words[0] != OUT_TAR_MARKER or words[2:] not in ([], ["inline"], ["inline", "removed"]):
        return stdout, OutTar(None)
    head = head.removesuffix("\n")
    said = OutTar(words[1], removed=words[3:] == ["removed"])  # what is said of it without the archive
    # base64 has no "-": the runner's own lines can hold the marker, the archive's cannot
    before, sep, encoded = head.rpartition(f"\n{INLINE_MARKER}\n")
    if not sep:
        return head, said
    if len(words) == 2 or not words[1].isdigit():
        return before, said
    compact = encoded.replace("\n", "")
    if len(compact) != 4 * ((int(words[1]) + 2) // 3):  # the host's word on its size bounds what is decoded
        return before, said
    try:
        data = binascii.a2b_base64(compact, strict_mode=True)
    except (binascii.Error, ValueError):
        return before, said
    return before, replace(said, inline=data) if len(data) == int(words[1]) else said


def kill_script(workspace: str) -> str:
    """Kill the runner's process group. Its pid file may lag the start by a moment: wait up to 5 s
    for it while the workspace exists, and up to 1 s while it does not (the run's own exec may be
    making it: a host with nothing pinned; a run cleaned up already never makes it again).

    The pid file is in the workspace, writable by the agent: the group is signalled only when its
    leader is this run's launcher — ``timeout`` whose arguments include this run's ``<workspace>/out``
    (``run_script``) — read from /proc, or ``ps`` where there is no /proc. Between the pid file and the
    launcher's ``exec`` the pid is still ``sh``: looked at again for up to 1 s.
    """
    ws = q(workspace)
    pid = f"{ws}/pid"
    own = f"{workspace}/out"
    return (
        f"i=0; while ! test -s {pid} && test $i -lt 50 && {{ test -d {ws} || test $i -lt 10; }}; do "
        "sleep 0.1; i=$((i+1)); done; "
        # The workspace is writable by what runs in it: signal only a plain number above 1
        # (a forged "1" would make this `kill -- -1`: every process of the user).
        f'p=$(head -c 32 {pid} 2>/dev/null); case "$p" in ""|*[!0-9]*) p=;; esac; '
        'test -n "$p" && test "$p" -gt 1 && { '
        "i=0; while test $i -lt 10 && kill -0 \"$p\" 2>/dev/null; do "
        'if test -r /proc/"$p"/cmdline; then a=$(tr "\\000" "\\n" < /proc/"$p"/cmdline 2>/dev/null); '
        'else a=$(ps -o args= -p "$p" 2>/dev/null | tr " " "\\n"); fi; '
        'if printf "%s\\n" "$a" | sed -n 1p | grep -q "^\\(.*/\\)\\{0,1\\}timeout$" && '
        f'printf "%s\\n" "$a" | grep -Fxq -- {q(own)}; '
        'then kill -s KILL -- -"$p" 2>/dev/null; break; fi; '
        "i=$((i+1)); sleep 0.1; done; }; true"
    )


#: run by the host's Python from this text: kill every process whose working directory, command line
#: or environment names the workspace (what a run left running, whatever session it made), wait for
#: them to go, print the ones still alive and exit 1 if any. It spares itself and the processes above
#: it (its shell, the run's, which name the workspace), known by their pids: no text a process can copy
#: into its own command line (a word on the scan's command line, readable in /proc) spares anything.
_SURVIVORS_PY = r"""
import os, sys, time
ws = sys.argv[1]
inside = (ws + "/").encode()
def mnt(pid):
    try:
        return os.readlink("/proc/%s/ns/mnt" % pid)
    except OSError:
        return None
def ppid(pid):
    try:
        with open("/proc/%s/status" % pid) as fh:
            for line in fh:
                if line.startswith("PPid:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0
ours = mnt("self")
try:
    st = os.stat(ws)
    ws_id = (st.st_dev, st.st_ino)
except OSError:
    ws_id = None
def this_host(pid):
    # Paths are per mount namespace: hosts that share this /proc (containers, test hosts) may use
    # the same workspace path. A process is this host's when the workspace path, resolved in its
    # own mount namespace, is our workspace directory (a sandbox made here sees the same one;
    # another host sees its own or none); without the workspace, by ancestry: it or a process above it
    # is in our mount namespace (an attempt's namespace is made from its runner's, itself made from ours).
    if ws_id is not None:
        try:
            st = os.stat("/proc/%s/root%s" % (pid, ws))
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == ws_id
    for _ in range(64):
        if mnt(pid) == ours:
            return True
        pid = ppid(pid)
        if pid <= 0:
            return False
    return False
def above(pid):
    chain = set()
    while pid > 0 and pid not in chain:
        chain.add(pid)
        pid = ppid(pid)
    return chain
spared = above(os.getpid())
def scan():
    found = []
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in spared]
    except OSError:
        return found
    for p in pids:
        # One stat tells another host's process first (hosts sharing this /proc: every other host's
        # processes are here too); the reads below are for this host's processes only.
        if ws_id is not None and not this_host(p):
            continue
        d = "/proc/" + p
        try:
            with open(d + "/cmdline", "rb") as fh:
                cmd = fh.read()
        except OSError:
            continue
        try:
            cwd = os.readlink(d + "/cwd")
        except OSError:
            cwd = ""
        hit = cwd == ws or cwd.startswith(ws + "/") or inside in cmd
        if not hit:
            try:
                with open(d + "/environ", "rb") as fh:
                    hit = inside in fh.read()
            except OSError:
                pass
        if hit and (ws_id is not None or this_host(p)):
            found.append(int(p))
    return found
left = scan()
for _ in range(30):
    if not left:
        break
    for pid in left:
        try:
            os.kill(pid, 9)  # SIGKILL everywhere (POSIX); the signal module's import is a third of the start
        except OSError:
            pass
    time.sleep(0.1)
    left = scan()
if left:
    sys.stderr.write("processes of the run still alive: %s\n" % " ".join(map(str, left[:10])))
    print("left")
    sys.exit(1)
print("checked")
"""


#: the file a runner makes in its workspace when it ended with no process of any attempt left
#: (``agent_runner.reaped.leave_reaped_mark``): the removal then has no process to look for
REAPED = "reaped"


def remove_script(workspace: str, python: str = "python3") -> str:
    """Kill what still runs of the workspace, remove it, then prove both are gone (exit 0 only when no
    process and no file of it is left; stderr says which is). The process check runs on the host's
    Python (``python``, else ``python3``); with neither, the workspace is not reported gone. Where the
    runner left ``REAPED`` (a file, not a link), no process of its attempts is left: no check runs."""
    ws = q(workspace)
    mark = q(posixpath.join(workspace, REAPED))
    check = f"{HELPER_FLAGS} -c {q(_SURVIVORS_PY)} {ws}"
    return (  # a subshell: its exits end only this part of a longer script
        f"( p=1; out=; if test -f {mark} && ! test -h {mark}; then out=checked; p=0; "
        f'else for py in {q(python)} python3; do out=$("$py" {check}); '
        f'case "$out" in checked) p=0; break;; left) break;; esac; done; fi; '
        f'test -n "$out" || echo cannot check for processes of {ws}: no working Python >&2; '
        f"rm -rf {ws}; ! test -e {ws} || {{ echo {ws} is still there after rm -rf >&2; exit 1; }}; exit $p )"
    )
