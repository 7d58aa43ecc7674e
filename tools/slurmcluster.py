#!/usr/bin/env python3
"""A real single-node Slurm cluster for tests: munged, slurmctld and slurmd of Debian's packages
(stdlib only; no systemd needed).

    python tools/slurmcluster.py up --state /var/tmp/crosshost-slurm    # prints SLURM_CONF=...
    SLURM_CONF=/var/tmp/crosshost-slurm/etc/slurm.conf sbatch --array=0-3 job.sh
    python tools/slurmcluster.py down --state /var/tmp/crosshost-slurm

Everything lives in the state directory: the munge key and socket, ``etc/slurm.conf`` (ports the
kernel picks at start, so several clusters and the machine's own Slurm never collide), the
controller's state, slurmd's spool and the logs. Clients reach this cluster, and no other, through
``SLURM_CONF``. The daemons run in the foreground of their own sessions; their pids are kept in the
state directory and ``down`` stops exactly those (checked by start time, so a reused pid is never
signalled), after cancelling the cluster's jobs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

#: Debian's packages that bring these programs (``make setup`` installs them)
PACKAGES = "slurmctld slurmd slurm-client munge"
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "sinfo", "scancel", "scontrol")
NODE = "crosshost-node"
PARTITION = "crosshost"
DAEMONS = ("munged", "slurmctld", "slurmd")
#: the states of a job that has ended, one way or another
ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                   "BOOT_FAIL", "DEADLINE"})

SLURM_CONF = """\
# written by tools/slurmcluster.py: one node, this machine, everything under {state}
ClusterName=crosshost
SlurmctldHost={hostname}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={state}/run/munge.sock
StateSaveLocation={state}/ctld
SlurmdSpoolDir={state}/spool
SlurmctldPidFile={state}/run/slurmctld.pid
SlurmdPidFile={state}/run/slurmd.pid
SlurmctldLogFile={state}/log/slurmctld.log
SlurmdLogFile={state}/log/slurmd.log
MailProg=/bin/true
# no cgroups: the sandbox (and a CI container) may not delegate them; processes are tracked by parentage
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# the node has the CPUs this file says, whatever the machine has: a job array's tasks run side by side
SlurmdParameters=config_overrides
ReturnToService=2
NodeName={node} NodeHostname={hostname} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName={partition} Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


class SlurmError(RuntimeError):
    """The cluster could not be started or used; the message says why (with the daemon's log tail)."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def short_hostname() -> str:
    """This machine's name as Slurm compares it (``hostname -s``): slurmctld runs as the controller
    only where SlurmctldHost is that name."""
    return socket.gethostname().split(".")[0]


def missing_programs() -> list[str]:
    return [p for p in PROGRAMS if shutil.which(p) is None and not Path("/usr/sbin", p).exists()]


def _program(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else None


def _tail(path: Path, lines: int = 12) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"({path} not written)"


class SlurmCluster:
    """One node's munged + slurmctld + slurmd, all state under ``state``."""

    def __init__(self, state: Path) -> None:
        self.state = Path(state).resolve()

    @property
    def conf(self) -> Path:
        return self.state / "etc" / "slurm.conf"

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """An environment whose Slurm clients (sbatch, squeue, ...) talk to this cluster."""
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = str(self.conf)
        return env

    # -- start -------------------------------------------------------------------------------
    def up(self, *, cpus: int = 4, wait_s: float = 60.0) -> None:
        missing = missing_programs()
        if missing:
            raise SlurmError(f"{', '.join(missing)} missing: apt-get install {PACKAGES} (make setup does)")
        if os.geteuid() != 0:
            raise SlurmError("the test cluster runs its daemons as root (SlurmUser=root); run as root")
        self.down()
        try:
            self._prepare(cpus)
            self._start_munged()
            self._start("slurmctld", [_program("slurmctld"), "-D", "-i", "-f", str(self.conf)])
            self._start("slurmd", [_program("slurmd"), "-D", "-N", NODE, "-f", str(self.conf)])
            self.wait_idle(wait_s)
        except BaseException:
            self.down()
            raise

    def _prepare(self, cpus: int) -> None:
        # munged insists: its socket's directories searchable by all, its key private to its owner
        self.state.mkdir(parents=True, exist_ok=True)
        self.state.chmod(0o711)
        for sub, mode in (("run", 0o755), ("etc", 0o700), ("log", 0o700), ("ctld", 0o700), ("spool", 0o755)):
            (self.state / sub).mkdir(exist_ok=True)
            (self.state / sub).chmod(mode)
        key = self.state / "etc" / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.conf.write_text(SLURM_CONF.format(
            state=self.state, hostname=short_hostname(), ctld_port=free_port(), slurmd_port=free_port(),
            cpus=cpus, node=NODE, partition=PARTITION,
        ))

    def _start_munged(self) -> None:
        s = self.state
        self._start("munged", [
            _program("munged"), "--foreground", "--force", f"--socket={s}/run/munge.sock",
            f"--key-file={s}/etc/munge.key", f"--log-file={s}/log/munged.log",
            f"--pid-file={s}/run/munged.pid", f"--seed-file={s}/etc/munged.seed",
        ])
        deadline = time.monotonic() + 15
        while not (s / "run" / "munge.sock").exists():
            self._check_alive("munged")
            if time.monotonic() > deadline:
                raise SlurmError(f"munged made no socket in 15s\n{_tail(s / 'log' / 'munged.log')}")
            time.sleep(0.05)

    def _start(self, name: str, argv: list[str]) -> None:
        with open(self.state / "log" / f"{name}.out", "wb") as out:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=self.env(), start_new_session=True, close_fds=True,
            )
        (self.state / "run" / f"{name}.proc").write_text(f"{proc.pid} {_start_time(proc.pid) or ''}\n")

    def _pid(self, name: str) -> int | None:
        """The daemon's pid while it is the process this cluster started, else None."""
        try:
            pid_text, _, started = (self.state / "run" / f"{name}.proc").read_text().strip().partition(" ")
            pid = int(pid_text)
        except (OSError, ValueError):
            return None
        return pid if started and _start_time(pid) == started else None

    def running(self) -> list[str]:
        """The daemons of this cluster still running (none once ``down`` has returned)."""
        return [name for name in DAEMONS if self._pid(name) is not None]

    def _check_alive(self, name: str) -> None:
        pid = self._pid(name)
        if pid is not None:
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == 0:
                    return
        raise SlurmError(f"{name} exited at start:\n{_tail(self.state / 'log' / f'{name}.out')}")

    def _client(self, argv: list[str], timeout_s: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True, env=self.env(), timeout=timeout_s)

    def wait_idle(self, timeout_s: float) -> None:
        """Return once the controller answers and the node takes jobs."""
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            for name in DAEMONS:
                self._check_alive(name)
            proc = self._client(["sinfo", "-h", "-N", "-n", NODE, "-o", "%T"])
            state = proc.stdout.strip()
            if proc.returncode == 0 and state.rstrip("*") in ("idle", "mixed", "allocated"):
                return
            last = state or proc.stderr.strip()
            time.sleep(0.2)
        raise SlurmError(
            f"node {NODE} not idle after {timeout_s:g}s ({last})\n"
            f"{_tail(self.state / 'log' / 'slurmctld.out')}\n{_tail(self.state / 'log' / 'slurmd.out')}"
        )

    # -- jobs --------------------------------------------------------------------------------
    def run_array(self, script: Path, count: int, *, workdir: Path, env: dict[str, str] | None = None,
                  timeout_s: float = 600) -> int:
        """Submit ``script`` as a job array of ``count`` tasks (environment ``env`` plus this cluster's
        SLURM_CONF) and wait until every task has ended; returns the array's job id. Task ``i`` writes
        its output to ``workdir/slurm-<job>_<i>.out``. A task that did not complete with exit 0 is a
        SlurmError with each such task's state and output."""
        proc = subprocess.run(
            ["sbatch", "--parsable", f"--array=0-{count - 1}", f"--chdir={workdir}",
             f"--output={workdir}/slurm-%A_%a.out", "--export=ALL", str(script)],
            capture_output=True, text=True, env=self.env(env), timeout=30,
        )
        job = proc.stdout.strip().split(";")[0]
        if proc.returncode != 0 or not job.isdigit():
            raise SlurmError(f"sbatch failed ({proc.returncode}): {proc.stderr.strip()}")
        # polled, not `sbatch --wait`: its poll interval grows to 10 s, longer than the tasks here
        deadline = time.monotonic() + timeout_s
        while True:
            tasks = self.array_tasks(int(job))
            if len(tasks) == count and all(state in ENDED for state, _ in tasks.values()):
                break
            if time.monotonic() > deadline:
                self._client(["scancel", job])
                raise SlurmError(f"job array {job} not done after {timeout_s:g}s: {tasks}")
            time.sleep(0.2)
        failed = {i: t for i, t in tasks.items() if t != ("COMPLETED", "0:0")}
        if failed:
            outputs = "\n".join(
                f"--- task {i}: {state}, exit {code}\n{_tail(workdir / f'slurm-{job}_{i}.out', 20)}"
                for i, (state, code) in sorted(failed.items())
            )
            raise SlurmError(f"job array {job}: {len(failed)} of {count} task(s) failed\n{outputs}")
        return int(job)

    def array_tasks(self, job: int) -> dict[int, tuple[str, str]]:
        """Each started task of array ``job``: index -> (JobState, ExitCode) as scontrol says them."""
        proc = self._client(["scontrol", "-o", "show", "job", str(job)])
        tasks: dict[int, tuple[str, str]] = {}
        for line in proc.stdout.splitlines():
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            task = fields.get("ArrayTaskId", "")
            if task.isdigit():  # a range ("0-3") is the part not started yet
                tasks[int(task)] = (fields.get("JobState", "?"), fields.get("ExitCode", "?"))
        return tasks

    # -- stop --------------------------------------------------------------------------------
    def down(self) -> None:
        """Cancel the cluster's jobs, stop its daemons (slurmd, slurmctld, munged) and wait for them."""
        if self._pid("slurmctld") is not None and self.conf.exists():
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                self._client(["scancel", "--quiet", f"--partition={PARTITION}"], timeout_s=10)
        for name in reversed(DAEMONS):
            pid = self._pid(name)
            if pid is None:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while self._pid(name) is not None and time.monotonic() < deadline:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
                time.sleep(0.05)
            if self._pid(name) is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
            (self.state / "run" / f"{name}.proc").unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="slurmcluster", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start munged, slurmctld and slurmd; print SLURM_CONF=...")
    up.add_argument("--state", type=Path, default=Path("/var/tmp/crosshost-slurm"))
    up.add_argument("--cpus", type=int, default=4, help="CPUs the node offers (default 4)")
    down = sub.add_parser("down", help="cancel the cluster's jobs and stop its daemons")
    down.add_argument("--state", type=Path, default=Path("/var/tmp/crosshost-slurm"))
    args = parser.parse_args(argv)
    cluster = SlurmCluster(args.state)
    try:
        if args.cmd == "down":
            cluster.down()
            print(f"stopped the Slurm cluster of {cluster.state}")
            return 0
        cluster.up(cpus=args.cpus)
    except SlurmError as exc:
        print(f"slurmcluster: error: {exc}", file=sys.stderr)
        return 1
    print(f"SLURM_CONF={cluster.conf}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
