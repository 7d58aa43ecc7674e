"""Commands crosshost runs on a host, built in one place and quoted with shlex.

The runner's environment is built here, never by fabric's ``env=`` (sshd's ``AcceptEnv`` drops it
silently): ``env -i`` empties it, then each allowlisted key gets either the value the inventory pins
(a shlex-quoted literal) or the host's OWN value, expanded by the host's shell
(``${PATH+"PATH=$PATH"}`` passes PATH only when the host has it). Nothing of the controller's
environment is ever part of a command.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence

_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

q = shlex.quote


def env_assignments(allowlist: Sequence[str], pinned: Mapping[str, str]) -> str:
    """The ``K=v`` words after ``env -i``, for the host's shell to expand."""
    words: list[str] = []
    for key in allowlist:
        if not _ENV_KEY.match(key):
            raise ValueError(f"env_allowlist: {key!r} is not an environment variable name")
        if key in pinned:
            words.append(q(f"{key}={pinned[key]}"))
        else:
            words.append(f'${{{key}+"{key}=${key}"}}')
    return " ".join(words)


def clean_env_command(allowlist: Sequence[str], pinned: Mapping[str, str], argv: Sequence[str]) -> str:
    """``env -i <allowlisted> argv...`` as shell text."""
    return " ".join(w for w in ("env -i", env_assignments(allowlist, pinned), shlex.join(argv)) if w)


def run_script(
    workspace: str,
    allowlist: Sequence[str],
    pinned: Mapping[str, str],
    argv: Sequence[str],
    kill_after_s: int,
) -> str:
    """The runner's command line: in its workspace, under ``timeout -s KILL``, with a clean env.

    ``timeout`` puts itself and the runner in a new process group; its pid (= the group id) is
    written to ``pid`` so an interrupted run can be killed as a whole (``kill_script``).
    """
    return (
        f"cd {q(workspace)} && echo $$ > pid && "
        f"exec timeout -s KILL {int(kill_after_s)} {clean_env_command(allowlist, pinned, argv)}"
    )


def kill_script(workspace: str) -> str:
    """Kill the runner's process group. Its pid file may lag the start by a moment: wait up to 5 s
    for it (only while the workspace exists, i.e. the run has not been cleaned up).

    The pid file is in the workspace, writable by the agent: the group is signalled only when its
    leader is this run's launcher — ``timeout`` whose arguments include this run's ``<workspace>/out``
    (``run_script``) — read from /proc, or ``ps`` where there is no /proc. Between the pid file and the
    launcher's ``exec`` the pid is still ``sh``: looked at again for up to 1 s.
    """
    ws = q(workspace)
    pid = f"{ws}/pid"
    own = f"{workspace}/out"
    return (
        f"i=0; while test -d {ws} && ! test -s {pid} && test $i -lt 50; do sleep 0.1; i=$((i+1)); done; "
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


def remove_script(workspace: str) -> str:
    """Remove the workspace, then prove it is gone (exit 0 only when nothing is left)."""
    return f"rm -rf {q(workspace)}; ! test -e {q(workspace)}"
