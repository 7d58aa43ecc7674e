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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from agent_runner.textguard import control_char, printable
from orchestrator.errors import InputError, SuiteError

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


@dataclass
class Schedule:
    suite_name: str
    every: Interval
    command: list[str]  # the replay command, absolute paths
    workdir: Path
    mode: Literal["systemd", "cron"]
    files: dict[str, str] = field(default_factory=dict)  # unit file name -> contents (systemd)
    cron_line: str | None = None


def replay_command(suite_dir: Path, inventory: Path, out: Path) -> list[str]:
    return [
        *crosshost_command(),
        "replay",
        str(suite_dir),
        "-i",
        str(inventory),
        "--out",
        str(out),
        "--compare-last",
    ]


def _systemd_units(
    stem: str, suite_name: str, every: Interval, command: list[str], workdir: Path
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


def cron_shell(command: list[str], workdir: Path, log: Path, lock: Path, timeout_s: int) -> str:
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
    return (
        f"cd {q(str(workdir))} && mkdir -p {q(str(log.parent))}"
        f" && {{ {run}; rc=$?; {said}; }} >> {q(str(log))} 2>&1"
    )


def _cron_line(every: Interval, command: list[str], workdir: Path, log: Path, lock: Path) -> str:
    shell = cron_shell(command, workdir, log, lock, every.seconds)
    return f"{cron_schedule(every)} {shell.replace('%', chr(92) + '%')}"  # cron turns a bare % into newline


def plan_schedule(
    suite_dir: Path,
    every: str,
    inventory: Path,
    out: Path,
    mode: Mode = "auto",
) -> Schedule:
    """What to install: validated interval, absolute paths, and the unit files or the crontab line."""
    interval = parse_every(every)
    suite_dir = _one_line_path(suite_dir.expanduser().absolute(), "suite")
    if not suite_dir.is_dir():
        raise SuiteError(f"{suite_dir}: no such suite directory")
    from orchestrator.hosts.bundle import read_suite

    suite_name = read_suite(suite_dir).name  # a broken suite is refused now, not at every replay
    inventory = _one_line_path(inventory.expanduser().absolute(), "-i")
    if not inventory.is_file():
        raise InputError(f"{inventory}: no such inventory; pass -i hosts.toml")
    out = _one_line_path(out.expanduser().absolute(), "--out")
    workdir = _one_line_path(Path.cwd(), "the working directory")
    command = replay_command(suite_dir, inventory, out)
    chosen: Literal["systemd", "cron"] = (
        ("systemd" if systemd_available() else "cron") if mode == "auto" else mode
    )
    sched = Schedule(suite_name, interval, command, workdir, chosen)
    if chosen == "systemd":
        sched.files = _systemd_units(unit_stem(suite_name), suite_name, interval, command, workdir)
    else:
        lock = out / f".{unit_stem(suite_name)}.lock"
        sched.cron_line = _cron_line(interval, command, workdir, out / "schedule.log", lock)
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


def schedule(
    suite_dir: Path,
    every: str,
    inventory: Path,
    out: Path,
    *,
    install_units: bool = False,
    cron: bool = False,
    systemd: bool = False,
) -> int:
    """``crosshost schedule``: print the crontab line or the unit files, or install the units."""
    if cron and systemd:
        raise InputError("--cron and --systemd: choose one")
    mode: Mode = "cron" if cron else "systemd" if systemd else "auto"
    plan = plan_schedule(suite_dir, every, inventory, out, mode)
    if plan.mode == "cron":
        print(plan.cron_line)
        if install_units:
            print(
                "# crosshost does not edit your crontab: add the line above with `crontab -e`",
                file=sys.stderr,
            )
        return 0
    if install_units:
        for path in install(plan):
            print(f"wrote {path}")
        timer = next(n for n in plan.files if n.endswith(".timer"))
        print(f"enable it with: systemctl --user daemon-reload && systemctl --user enable --now {timer}")
        return 0
    unit_dir = user_unit_dir()
    for name, text in plan.files.items():
        print(f"# {unit_dir / name}\n{text}")
    return 0
