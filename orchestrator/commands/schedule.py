"""Scheduled cross-host comparisons: a systemd user timer + service, or a crontab line.

crosshost runs no daemon of its own: the system scheduler starts ``crosshost replay ...
--compare-last`` every interval, and the history index says what newly flips. Every path in the
generated command is absolute, because neither systemd nor cron starts in the user's directory.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from agent_runner.textguard import control_char, printable
from orchestrator.errors import CrosshostError, InputError, SuiteError

Mode = Literal["auto", "systemd", "cron"]

_EVERY = re.compile(r"^\s*(\d+)\s*(m|min|h|d)\s*$")
_UNIT_SECONDS = {"m": 60, "min": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class Interval:
    text: str  # as the user wrote it, normalised: "30m", "6h", "1d"
    seconds: int

    @property
    def minutes(self) -> int:
        return self.seconds // 60


def parse_every(text: str) -> Interval:
    """``30m``, ``6h``, ``1d``: a positive whole number of minutes, hours or days."""
    m = _EVERY.match(text)
    if not m or int(m.group(1)) == 0:
        raise InputError(
            f"--every {text!r}: expected a positive interval such as 30m, 6h or 1d (units: m, h, d)"
        )
    n, unit = int(m.group(1)), m.group(2)
    unit = "m" if unit == "min" else unit
    return Interval(f"{n}{unit}", n * _UNIT_SECONDS[unit])


def cron_schedule(every: Interval) -> str:
    """The five cron fields for an interval cron can express exactly, else a clear InputError."""
    mins = every.minutes
    if mins < 60 and 60 % mins == 0:
        return f"*/{mins} * * * *" if mins > 1 else "* * * * *"
    if mins % 60 == 0 and mins < 1440 and 24 % (mins // 60) == 0:
        return f"0 */{mins // 60} * * *"
    if mins == 1440:
        return "0 0 * * *"
    if mins == 10080:
        return "0 0 * * 0"
    raise InputError(
        f"--every {every.text}: cron cannot run that interval exactly; use minutes dividing 60 "
        "(e.g. 15m, 30m), hours dividing 24 (e.g. 6h, 12h), 1d or 7d, or use the systemd timer"
    )


def systemd_calendar(every: Interval) -> str | None:
    """An OnCalendar= expression when the interval divides the day evenly, else None."""
    mins = every.minutes
    if mins < 60 and 60 % mins == 0:
        return f"*-*-* *:00/{mins}:00"
    if mins % 60 == 0 and mins < 1440 and 24 % (mins // 60) == 0:
        return f"*-*-* 00/{mins // 60}:00:00"
    if mins == 1440:
        return "*-*-* 00:00:00"
    return None


def systemd_available() -> bool:
    """The test sd_booted() uses: systemd is the running init, and systemctl is installed."""
    return Path("/run/systemd/system").is_dir() and shutil.which("systemctl") is not None


def crosshost_command() -> list[str]:
    """An absolute command line that starts this crosshost, from the scheduler's empty environment."""
    beside = Path(sys.executable).parent / "crosshost"  # the venv's console script
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)]
    found = shutil.which("crosshost")
    if found:
        return [str(Path(found).resolve())]
    return [str(Path(sys.executable).absolute()), "-m", "orchestrator.cli"]


def unit_stem(suite_name: str) -> str:
    """``crosshost-<suite>``, with anything systemd or a file name would choke on replaced."""
    return "crosshost-" + (re.sub(r"[^A-Za-z0-9_.-]+", "-", suite_name).strip("-.") or "suite")


def systemd_quote(arg: str) -> str:
    """Quote one ExecStart= word: systemd's own rules (not a shell), plus % and $ escaped."""
    if control_char(arg):  # plan_schedule refuses these; a unit line must never be split by one
        raise InputError(f"{arg!r}: a control character cannot be written into a unit file")
    escaped = arg.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    if escaped == arg and re.fullmatch(r"[A-Za-z0-9_./:=,+@-]+", arg):
        return arg
    return f'"{escaped}"'


def systemd_path(path: Path) -> str:
    """A path as the value of a unit setting that takes one (WorkingDirectory=): systemd expands
    specifiers there but neither unquotes nor expands ``$``, so only ``%`` is escaped; a path it would
    read otherwise (surrounding whitespace is stripped, a trailing backslash continues the line) is refused."""
    text = str(path)
    if control_char(text) or text != text.strip() or text.endswith("\\"):
        raise InputError(
            f"{text!r}: a unit file cannot hold this path (a control character, surrounding whitespace "
            "or a trailing backslash); schedule from a directory without one, or use --cron"
        )
    return text.replace("%", "%%")


def _unit_text(text: str) -> str:
    """Free text in a unit file: one line (control characters shown, not obeyed), specifiers escaped."""
    return printable(text).replace("\n", " ").replace("%", "%%")


def _one_line_path(path: Path, what: str) -> Path:
    """A path that goes into a unit file or a crontab line: a newline there would start a new
    directive or a new crontab entry, so a path holding a control character is refused."""
    bad = control_char(str(path))
    if bad:
        raise InputError(f"{what} {str(path)!r} holds a control character ({bad}); schedule a path without one")
    return path


@dataclass(frozen=True)
class Credential:
    """An environment variable a scheduled replay needs and a unit does not inherit."""

    key: str
    why: str  # what needs it: "host 'box-c': key 'use_agent'", "suite triage: agent.api_key_env"


@dataclass
class Schedule:
    suite_name: str
    every: Interval
    command: list[str]  # the replay command, absolute paths
    workdir: Path
    mode: Literal["systemd", "cron"]
    files: dict[str, str] = field(default_factory=dict)  # unit file name -> contents (systemd)
    cron_line: str | None = None
    credentials: list[Credential] = field(default_factory=list)
    #: where the unit or the crontab line reads ``credentials`` from (None: it needs none)
    env_file: Path | None = None


def replay_command(suite_dir: Path, inventory: Path, out: Path) -> list[str]:
    # --scheduled: a failure before the run starts is recorded where `crosshost history` shows it
    return [
        *crosshost_command(),
        "replay",
        str(suite_dir),
        "-i",
        str(inventory),
        "--out",
        str(out),
        "--scheduled",
        "--compare-last",
    ]


def credentials_needed(inventory: Path, suite: object, environ: Mapping[str, str]) -> list[Credential]:
    """Every variable the scheduled replay reads from its environment to authenticate: SSH_AUTH_SOCK
    for a ``use_agent`` host (or hop), each ``passphrase_env``, the suite's ``api_key_env``. Loading
    the inventory refuses one that is not set here (exit 2), as the replay would; so does an unset
    ``api_key_env``."""
    from orchestrator.hosts.inventory import load_inventory
    from orchestrator.model.settings import openai_agent_config, require_api_key

    needed: dict[str, Credential] = {}
    for host in load_inventory(inventory).hosts:
        for cfg in [host, *host.jump]:
            where = f"host {host.name!r}" + (f" (jump host {cfg.name!r})" if cfg is not host else "")
            if cfg.transport == "ssh" and cfg.use_agent:
                needed.setdefault("SSH_AUTH_SOCK", Credential("SSH_AUTH_SOCK", f"{where}: key 'use_agent'"))
            if cfg.transport == "ssh" and cfg.passphrase_env:
                key = cfg.passphrase_env
                needed.setdefault(key, Credential(key, f"{where}: key 'passphrase_env'"))
    model = openai_agent_config(suite)  # type: ignore[arg-type]
    if model and model.api_key_env:
        key = model.api_key_env
        why = f"suite {getattr(suite, 'name', '?')}: agent.api_key_env"
        try:
            require_api_key(key, environ, where=f"suite {getattr(suite, 'name', '?')}")
        except CrosshostError as exc:
            raise InputError(f"{why}: {key} is not set here, and the scheduled run needs it ({exc})") from None
        needed.setdefault(key, Credential(key, why))
    return list(needed.values())


def env_file_path(stem: str) -> Path:
    """Where a schedule's credentials wait for its unit: ``~/.config/crosshost/<stem>.env``."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "crosshost" / f"{stem}.env"


def env_file_text(credentials: list[Credential], environ: Mapping[str, str]) -> str:
    """``KEY=value`` lines, single-quoted where needed: what both systemd's EnvironmentFile= and
    ``sh``'s ``.`` read alike. A value the two would read differently is refused."""
    lines = []
    for c in credentials:
        value = environ.get(c.key, "")
        if not value:
            raise InputError(f"{c.why}: {c.key} is not set here, and the scheduled run needs it")
        if any(ch in value for ch in "'\\\n\"") or control_char(value):
            raise InputError(
                f"{c.why}: the value of {c.key} holds a quote, a backslash or a control character; "
                f"write {c.key}=... into {env_file_path('<unit>')} yourself, as systemd and sh both read it"
            )
        lines.append(f"{c.key}={shlex.quote(value)}\n")
    return "".join(lines)


def write_env_file(path: Path, text: str) -> None:
    """Mode 0600 from its first byte, in a directory only its owner reads (it holds passphrases, keys)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def _systemd_units(
    stem: str, suite_name: str, every: Interval, command: list[str], workdir: Path, env_file: Path | None = None
) -> dict[str, str]:
    service = "\n".join(
        [
            "[Unit]",
            f"Description=crosshost: replay suite {_unit_text(suite_name)} across hosts and compare with the last run",
            "",
            "[Service]",
            # a timer never starts a service that is still running, so replays do not overlap; this
            # stops one that outlives its interval with SIGINT (the replay's Ctrl-C: remote workspaces
            # removed), as the crontab line's timeout does
            "Type=oneshot",
            f"TimeoutStartSec={every.seconds}s",
            "KillSignal=SIGINT",
            f"WorkingDirectory={systemd_path(workdir)}",
            # the credentials the replay needs: a unit inherits nothing of the shell that wrote it
            *([f"EnvironmentFile={systemd_path(env_file)}"] if env_file else []),
            "ExecStart=" + " ".join(systemd_quote(a) for a in command),
            "",
        ]
    )
    calendar = systemd_calendar(every)
    trigger = (
        [f"OnCalendar={calendar}", "Persistent=true"]
        # no calendar form: a monotonic timer; OnActiveSec starts the first run, the rest follow it
        if calendar
        else [f"OnActiveSec={every.seconds}s", f"OnUnitActiveSec={every.seconds}s"]
    )
    timer = "\n".join(
        [
            "[Unit]",
            f"Description=crosshost: replay suite {_unit_text(suite_name)} every {every.text}",
            "",
            "[Timer]",
            *trigger,
            f"Unit={stem}.service",
            "",
            "[Install]",
            "WantedBy=timers.target",
            "",
        ]
    )
    return {f"{stem}.service": service, f"{stem}.timer": timer}


#: flock's exit code when the lock is held (a previous replay still runs); 75 is EX_TEMPFAIL
LOCK_BUSY_EXIT = 75
#: after TERM at the interval's end, KILL this much later (the replay's Ctrl-C path cleans the hosts)
KILL_AFTER_S = 60


def cron_shell(
    command: list[str], workdir: Path, log: Path, lock: Path, timeout_s: int, env_file: Path | None = None
) -> str:
    """The crontab line's shell: one replay at a time (``flock -n``: a start while the previous
    replay still holds the lock is skipped and logged) and never longer than ``timeout_s``
    (``timeout``: SIGINT, the replay's Ctrl-C that removes its remote workspaces, then KILL after
    ``KILL_AFTER_S``), everything appended to ``log``."""
    q = shlex.quote
    run = (
        f"flock -n -E {LOCK_BUSY_EXIT} {q(str(lock))} "
        f"timeout -s INT -k {KILL_AFTER_S} {timeout_s} {shlex.join(command)}"
    )
    skipped = q(f"crosshost schedule: skipped, the previous replay still holds {lock}")
    stopped = q(f"crosshost schedule: replay stopped after {timeout_s} s (the interval)")
    said = f"case $rc in {LOCK_BUSY_EXIT}) echo {skipped};; 124|137) echo {stopped};; esac"
    # the credentials the replay needs, exported from the schedule's file (cron's environment has none)
    env = f"set -a && . {q(str(env_file))} && set +a && " if env_file else ""
    return (
        f"cd {q(str(workdir))} && mkdir -p {q(str(log.parent))}"
        f" && {{ {env}{run}; rc=$?; {said}; }} >> {q(str(log))} 2>&1"
    )


def _cron_line(
    every: Interval, command: list[str], workdir: Path, log: Path, lock: Path, env_file: Path | None = None
) -> str:
    shell = cron_shell(command, workdir, log, lock, every.seconds, env_file)
    return f"{cron_schedule(every)} {shell.replace('%', chr(92) + '%')}"  # cron turns a bare % into newline


def plan_schedule(
    suite_dir: Path,
    every: str,
    inventory: Path,
    out: Path,
    mode: Mode = "auto",
) -> Schedule:
    """What to install: validated interval, absolute paths, the credentials the replay needs (each
    set here, or refused), and the unit files or the crontab line."""
    interval = parse_every(every)
    suite_dir = _one_line_path(suite_dir.expanduser().absolute(), "suite")
    if not suite_dir.is_dir():
        raise SuiteError(f"{suite_dir}: no such suite directory")
    from orchestrator.hosts.bundle import read_suite

    suite = read_suite(suite_dir)  # a broken suite is refused now, not at every replay
    suite_name = suite.name
    inventory = _one_line_path(inventory.expanduser().absolute(), "-i")
    if not inventory.is_file():
        raise InputError(f"{inventory}: no such inventory; pass -i hosts.toml")
    credentials = credentials_needed(inventory, suite, os.environ)
    out = _one_line_path(out.expanduser().absolute(), "--out")
    workdir = _one_line_path(Path.cwd(), "the working directory")
    command = replay_command(suite_dir, inventory, out)
    chosen: Literal["systemd", "cron"] = (
        ("systemd" if systemd_available() else "cron") if mode == "auto" else mode
    )
    stem = unit_stem(suite_name)
    env_file = _one_line_path(env_file_path(stem), "the environment file") if credentials else None
    sched = Schedule(suite_name, interval, command, workdir, chosen, credentials=credentials, env_file=env_file)
    if chosen == "systemd":
        sched.files = _systemd_units(stem, suite_name, interval, command, workdir, env_file)
    else:
        lock = out / f".{stem}.lock"
        sched.cron_line = _cron_line(interval, command, workdir, out / "schedule.log", lock, env_file)
    return sched



def user_unit_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "systemd" / "user"


def install(sched: Schedule, unit_dir: Path | None = None) -> list[Path]:
    """Write the unit files (systemd only; a crontab is the user's to edit). Returns the paths."""
    unit_dir = unit_dir or user_unit_dir()
    unit_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in sched.files.items():
        path = unit_dir / name
        path.write_text(text)
        written.append(path)
    return written


#: the environment each scheduler starts a job with (besides the schedule's environment file)
CRON_PATH = "/usr/bin:/bin"
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def unit_environment(plan: Schedule, environ: Mapping[str, str]) -> dict[str, str]:
    """What the scheduler gives the replay: cron a bare HOME, LOGNAME, SHELL and PATH; a systemd user
    service its manager's HOME, USER, LOGNAME, SHELL, PATH and XDG_RUNTIME_DIR. Nothing of this shell."""
    user = environ.get("USER") or environ.get("LOGNAME") or ""
    home = environ.get("HOME") or str(Path.home())
    if plan.mode == "cron":
        return {"HOME": home, "LOGNAME": user, "SHELL": "/bin/sh", "PATH": CRON_PATH}
    env = {"HOME": home, "USER": user, "LOGNAME": user, "SHELL": environ.get("SHELL", "/bin/sh"), "PATH": SYSTEMD_PATH}
    if environ.get("XDG_RUNTIME_DIR"):
        env["XDG_RUNTIME_DIR"] = environ["XDG_RUNTIME_DIR"]
    return env


def check_command(plan: Schedule, environ: Mapping[str, str]) -> list[str]:
    """The scheduled replay as its scheduler starts it: ``env -i`` with the unit's environment, the
    schedule's environment file read as the unit reads it, in the unit's working directory."""
    base = ["env", "-i", *(f"{k}={v}" for k, v in unit_environment(plan, environ).items())]
    if plan.env_file is None:
        return [*base, *plan.command]
    read = 'set -a && . "$1" && set +a && shift && exec "$@"'
    return [*base, "/bin/sh", "-c", read, "crosshost-schedule", str(plan.env_file), *plan.command]


def run_check(plan: Schedule, environ: Mapping[str, str]) -> int:
    """``schedule --check``: the scheduled replay once, now, as its scheduler would start it; its
    output as it comes. The replay's exit code: 0 or 1 mean it ran (1: flips, as any replay)."""
    import subprocess

    who = "cron starts it" if plan.mode == "cron" else "systemd starts the service"
    env = ", ".join(k if k != "PATH" else f"PATH={v}" for k, v in unit_environment(plan, environ).items())
    also = f"; and {plan.env_file}" if plan.env_file else ""
    print(f"check: running the scheduled replay once as {who} (env -i: {env}{also})", flush=True)
    if plan.env_file is not None and not plan.env_file.is_file():
        print(f"check: {plan.env_file} does not exist: the run gets none of {_names(plan)}", flush=True)
    try:
        rc = subprocess.run(check_command(plan, environ), cwd=plan.workdir, timeout=plan.every.seconds).returncode
    except subprocess.TimeoutExpired:
        rc = 124
    meaning = {0: "valid, within the gate", 1: "it ran: invalid, flips over the gate or a new flip",
               2: "bad input: the line above says what", 3: "a host failed", 124: "stopped after the interval"}
    print(f"check: the scheduled replay exited {rc} ({meaning.get(rc, 'see crosshost replay --help')})")
    return 0 if rc in (0, 1) else rc


def _names(plan: Schedule) -> str:
    return ", ".join(c.key for c in plan.credentials)


def say_credentials(plan: Schedule, environ: Mapping[str, str], *, installed: bool) -> None:
    """On stderr: what the scheduled run needs from its environment and how it gets it."""
    if not plan.credentials or plan.env_file is None:
        return
    needs = ", ".join(f"{c.key} ({c.why})" for c in plan.credentials)
    reader = "the crontab line" if plan.mode == "cron" else "the service (EnvironmentFile=)"
    if not installed:
        print(
            f"crosshost schedule: the scheduled run needs {needs}; systemd and cron start it without this "
            f"shell's environment: --install writes this shell's values into {plan.env_file} (mode 0600), "
            f"which {reader} reads; or write that file yourself, one KEY='value' a line",
            file=sys.stderr,
        )
    if any(c.key == "SSH_AUTH_SOCK" for c in plan.credentials):
        print(
            f"crosshost schedule: SSH_AUTH_SOCK is this login's agent ({environ.get('SSH_AUTH_SOCK', '')}): "
            "a scheduled run reaches it only while that ssh-agent runs; for runs after you log out, start "
            "an agent that outlives the login (ssh-agent -a PATH with the key added) and put its socket "
            f"in {plan.env_file}, or use a key file with passphrase_env",
            file=sys.stderr,
        )


def schedule(
    suite_dir: Path,
    every: str,
    inventory: Path,
    out: Path,
    *,
    install_units: bool = False,
    cron: bool = False,
    systemd: bool = False,
    check: bool = False,
) -> int:
    """``crosshost schedule``: print the crontab line or the unit files, or install the units (and
    the environment file with the credentials the run needs); ``check``: run it once as scheduled."""
    if cron and systemd:
        raise InputError("--cron and --systemd: choose one")
    mode: Mode = "cron" if cron else "systemd" if systemd else "auto"
    plan = plan_schedule(suite_dir, every, inventory, out, mode)
    environ = os.environ
    if install_units and plan.env_file is not None:
        write_env_file(plan.env_file, env_file_text(plan.credentials, environ))
        print(f"wrote {plan.env_file} (mode 0600): {_names(plan)}")
    say_credentials(plan, environ, installed=install_units)
    if plan.mode == "cron":
        print(plan.cron_line)
        if install_units:
            print(
                "# crosshost does not edit your crontab: add the line above with `crontab -e`",
                file=sys.stderr,
            )
    elif install_units:
        for path in install(plan):
            print(f"wrote {path}")
        timer = next(n for n in plan.files if n.endswith(".timer"))
        print(f"enable it with: systemctl --user daemon-reload && systemctl --user enable --now {timer}")
    else:
        unit_dir = user_unit_dir()
        for name, text in plan.files.items():
            print(f"# {unit_dir / name}\n{text}")
    return run_check(plan, environ) if check else 0
