"""`crosshost schedule`: systemd user timer/service pair and crontab line, both checked as such."""

from __future__ import annotations

import configparser
import datetime as dt
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.commands import schedule
from orchestrator.errors import InputError

TRIAGE = Path(__file__).resolve().parents[2] / "examples" / "suites" / "triage"


@pytest.fixture()
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "suites").mkdir()
    shutil.copytree(TRIAGE, tmp_path / "suites" / "tri age")  # a real suite: schedule validates it
    (tmp_path / "hosts.toml").write_text("[[hosts]]\nname = 'local'\ntransport = 'local'\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path


def parse_unit(text: str) -> configparser.ConfigParser:
    cp = configparser.ConfigParser(interpolation=None, strict=True)
    cp.optionxform = str  # type: ignore[assignment,method-assign]  # unit keys are case-sensitive
    cp.read_string(text)
    return cp


def split_exec(value: str) -> list[str]:
    # systemd's ExecStart= quoting is close enough to POSIX for the arguments we generate
    return [w.replace("%%", "%").replace("$$", "$") for w in shlex.split(value)]


@pytest.mark.parametrize(
    ("every", "seconds"), [("30m", 1800), ("6h", 21600), ("1d", 86400), ("90m", 5400), ("15 min", 900)]
)
def test_parse_every(every: str, seconds: int) -> None:
    assert schedule.parse_every(every).seconds == seconds


@pytest.mark.parametrize("bad", ["", "6", "0h", "6x", "-1h", "1.5h", "h"])
def test_parse_every_rejects(bad: str) -> None:
    with pytest.raises(InputError, match="--every"):
        schedule.parse_every(bad)


@pytest.mark.parametrize("every", ["30m", "6h", "90m"])
def test_systemd_pair(project: Path, every: str) -> None:
    plan = schedule.plan_schedule(Path("suites/tri age"), every, Path("hosts.toml"), Path("runs"), "systemd")
    assert sorted(plan.files) == ["crosshost-triage.service", "crosshost-triage.timer"]
    service = parse_unit(plan.files["crosshost-triage.service"])
    timer = parse_unit(plan.files["crosshost-triage.timer"])

    assert service["Service"]["Type"] == "oneshot"
    # the timer never overlaps a running oneshot; a replay longer than the interval is stopped as by Ctrl-C
    assert service["Service"]["TimeoutStartSec"] == f"{schedule.parse_every(every).seconds}s"
    assert service["Service"]["KillSignal"] == "SIGINT"
    argv = split_exec(service["Service"]["ExecStart"])
    assert Path(argv[0]).is_absolute() and Path(argv[0]).exists()
    i = argv.index("replay")
    assert argv[i + 1] == str(project / "suites" / "tri age")
    assert argv[argv.index("-i") + 1] == str(project / "hosts.toml")
    assert argv[argv.index("--out") + 1] == str(project / "runs")
    assert "--compare-last" in argv

    assert timer["Timer"]["Unit"] == "crosshost-triage.service"
    assert timer["Install"]["WantedBy"] == "timers.target"
    if every == "90m":  # not a divisor of the day: monotonic timer with the interval in seconds
        assert timer["Timer"]["OnUnitActiveSec"] == "5400s" and timer["Timer"]["OnActiveSec"] == "5400s"
    else:
        cal = timer["Timer"]["OnCalendar"]
        if shutil.which("systemd-analyze"):
            # the calendar expression must fire exactly every interval
            out = subprocess.run(
                ["systemd-analyze", "calendar", "--iterations=3", cal],
                capture_output=True,
                text=True,
                check=True,
                env={**os.environ, "TZ": "UTC"},
            ).stdout
            stamps = re.findall(r"\w{3} (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC", out)
            times = [dt.datetime.strptime(s, "%Y-%m-%d %H:%M:%S") for s in stamps]
            assert len(times) == 3, out
            deltas = {(b - a).total_seconds() for a, b in zip(times, times[1:], strict=False)}
            assert deltas == {schedule.parse_every(every).seconds}, out


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="parsed above; verify needs systemd-analyze")
def test_systemd_analyze_verify(project: Path) -> None:
    res = CliRunner().invoke(app, ["schedule", "suites/tri age", "--every", "6h", "--systemd", "--install"])
    assert res.exit_code == 0, res.output
    unit_dir = project / "config" / "systemd" / "user"
    files = sorted(unit_dir.iterdir())
    assert [f.name for f in files] == ["crosshost-triage.service", "crosshost-triage.timer"]
    assert "systemctl --user enable --now crosshost-triage.timer" in res.output
    v = subprocess.run(["systemd-analyze", "verify", *map(str, files)], capture_output=True, text=True)
    assert v.returncode == 0, v.stderr
    # and verify does catch a broken unit, so the pass above means something
    broken = unit_dir / "crosshost-broken.timer"
    broken.write_text(files[1].read_text().replace("OnCalendar=", "OnCalendar=every now and then "))
    v = subprocess.run(
        ["systemd-analyze", "verify", str(files[0]), str(broken)], capture_output=True, text=True
    )
    assert v.returncode != 0


@pytest.mark.parametrize(
    ("every", "fields"),
    [("30m", "*/30 * * * *"), ("1m", "* * * * *"), ("6h", "0 */6 * * *"), ("1d", "0 0 * * *")],
)
def test_crontab_line(project: Path, every: str, fields: str) -> None:
    res = CliRunner().invoke(app, ["schedule", "suites/tri age", "--every", every, "--cron"])
    assert res.exit_code == 0, res.output
    (line,) = res.output.strip().splitlines()
    parts = line.split(None, 5)
    assert len(parts) == 6 and " ".join(parts[:5]) == fields
    for field_, (lo, hi) in zip(parts[:5], [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)], strict=True):
        base, _, step = field_.partition("/")
        assert base == "*" or lo <= int(base) <= hi
        assert not step or 1 <= int(step) <= hi
    cmd = shlex.split(parts[5])
    assert cmd[:2] == ["cd", str(project)]
    i = cmd.index("replay")
    assert Path(cmd[i - 1]).is_absolute()
    assert cmd[i + 1] == str(project / "suites" / "tri age")
    assert "--compare-last;" in cmd and cmd[cmd.index(">>") + 1] == str(project / "runs" / "schedule.log")
    # one replay at a time, each at most one interval long
    lock = cmd.index("flock")
    assert cmd[lock + 1 : lock + 5] == ["-n", "-E", "75", str(project / "runs" / ".crosshost-triage.lock")]
    assert cmd[lock + 5 : lock + 11] == [
        "timeout", "-s", "INT", "-k", "60", str(schedule.parse_every(every).seconds)
    ]  # fmt: skip


SLOW = """
import signal, sys, time
def stop(*_):
    print("replay: interrupted, workspaces removed", flush=True)
    sys.exit(130)
signal.signal(signal.SIGINT, stop)
print("replay: started", flush=True)
time.sleep(float(sys.argv[1]))
print("replay: finished", flush=True)
"""


def _cron_shell(tmp_path: Path, seconds: float, timeout_s: int) -> str:
    script = tmp_path / "slow.py"
    script.write_text(SLOW)
    return schedule.cron_shell(
        [sys.executable, str(script), str(seconds)], tmp_path, tmp_path / "runs" / "schedule.log",
        tmp_path / "runs" / ".lock", timeout_s,
    )  # fmt: skip


def test_cron_line_skips_a_start_while_the_previous_replay_still_runs(tmp_path: Path) -> None:
    shell = _cron_shell(tmp_path, 3, 60)
    log = tmp_path / "runs" / "schedule.log"
    first = subprocess.Popen(["sh", "-c", shell])
    try:
        deadline = time.monotonic() + 10
        while "started" not in (log.read_text() if log.exists() else "") and time.monotonic() < deadline:
            time.sleep(0.05)
        second = subprocess.run(["sh", "-c", shell], timeout=10)
        assert second.returncode == 0
        assert log.read_text().splitlines() == [
            "replay: started",
            f"crosshost schedule: skipped, the previous replay still holds {tmp_path / 'runs' / '.lock'}",
        ]
    finally:
        first.wait(timeout=20)
    assert log.read_text().splitlines()[-1] == "replay: finished"
    # the lock is free again: the next start runs
    subprocess.run(["sh", "-c", _cron_shell(tmp_path, 0, 60)], timeout=10, check=True)
    assert log.read_text().splitlines()[-2:] == ["replay: started", "replay: finished"]


def test_cron_line_stops_a_replay_that_outlives_its_interval_with_ctrl_c(tmp_path: Path) -> None:
    t0 = time.monotonic()
    subprocess.run(["sh", "-c", _cron_shell(tmp_path, 60, 1)], timeout=30, check=True)
    assert time.monotonic() - t0 < 20
    assert (tmp_path / "runs" / "schedule.log").read_text().splitlines() == [
        "replay: started",
        "replay: interrupted, workspaces removed",
        "crosshost schedule: replay stopped after 1 s (the interval)",
    ]


def test_cron_escapes_percent(project: Path) -> None:
    shutil.copytree(TRIAGE, project / "suites" / "50%")
    plan = schedule.plan_schedule(Path("suites/50%"), "1h", Path("hosts.toml"), Path("runs"), "cron")
    assert plan.cron_line is not None and "50\\%" in plan.cron_line and "50%" not in plan.cron_line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["suites/tri age", "--every", "6 hours"], "--every '6 hours'"),
        (["suites/tri age", "--every", "45m", "--cron"], "cron cannot run that interval"),
        (["nope", "--every", "6h"], "nope: no such suite directory"),
        (["suites/tri age", "-i", "missing.toml"], "missing.toml: no such inventory"),
        (["suites", "--every", "6h"], "suite.toml: missing"),
        (["suites/broken", "--every", "6h"], "suite.toml: unknown key(s) retries"),
    ],
)
def test_bad_input_exits_2(project: Path, args: list[str], message: str) -> None:
    shutil.copytree(TRIAGE, project / "suites" / "broken")
    toml = project / "suites" / "broken" / "suite.toml"
    toml.write_text("retries = 3\n" + toml.read_text())
    res = CliRunner().invoke(app, ["schedule", *args])
    assert res.exit_code == 2
    assert message in res.output and "Traceback" not in res.output


def test_auto_falls_back_to_cron_without_systemd(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schedule, "systemd_available", lambda: False)
    assert (
        schedule.plan_schedule(Path("suites/tri age"), "6h", Path("hosts.toml"), Path("runs")).mode == "cron"
    )
    monkeypatch.setattr(schedule, "systemd_available", lambda: True)
    assert (
        schedule.plan_schedule(Path("suites/tri age"), "6h", Path("hosts.toml"), Path("runs")).mode
        == "systemd"
    )
