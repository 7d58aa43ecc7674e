"""The baselines crosshost is measured against, each run on the same real sshd hosts.

- ``limit``: the predicates themselves with nothing around them: one ``ssh`` per host (all hosts
  in parallel) that unpacks the predicates from stdin, runs them one after another and cleans up.
- ``naive``: the articles' loop: per host (hosts in sequence) and per task, ``scp`` the task,
  ``ssh`` to run it, ``scp`` the result back.
- ``ansible``: ansible-core with its default settings (forks 5), and once with pipelining on and an
  explicit ControlPersist; the playbook is bench/ansible/replay.yml.

Every client uses the fleet's own known_hosts with strict checking, never the user's.
Each function returns the wall-clock seconds of the work and raises ``BaselineError`` if any
host or task failed (a failed run is no measurement).
"""

from __future__ import annotations

import io
import os
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.gen_suite import BenchSuite

ANSIBLE_DIR = Path(__file__).resolve().parent / "ansible"


class BaselineError(RuntimeError):
    """A baseline run failed; the message names the tool, host and task."""


@dataclass(frozen=True)
class BenchHost:
    name: str
    address: str
    port: int
    user: str
    identity: Path
    known_hosts: Path

    @property
    def target(self) -> str:
        return f"{self.user}@{self.address}"

    def ssh_options(self) -> list[str]:
        return [
            "-i", str(self.identity), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
            "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "StrictHostKeyChecking=yes",
            "-o", "ForwardAgent=no", "-o", "ConnectTimeout=10",
        ]

    def ssh(self, remote_cmd: str) -> list[str]:
        return ["ssh", "-p", str(self.port), *self.ssh_options(), self.target, remote_cmd]

    def scp(self, *args: str) -> list[str]:
        return ["scp", "-q", "-P", str(self.port), *self.ssh_options(), *args]


def _check(proc: subprocess.CompletedProcess[bytes], what: str) -> None:
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip().splitlines()[-3:]
        raise BaselineError(f"{what}: exit {proc.returncode}: {' | '.join(err)}")


def _predicates_tar(suite: BenchSuite) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for task in suite.predicate_tasks:
            tar.add(suite.root / "tasks" / task / "repo", arcname=f"{task}/repo")
    return buf.getvalue()


def run_limit(suite: BenchSuite, hosts: Sequence[BenchHost], *, slots: int = 1) -> float:
    """One ssh per host (``slots`` per host, each with its share of the tasks), all in parallel: unpack
    the predicates, run them in sequence, clean up. With ``slots``, the limit of the same parallelism."""
    payload = _predicates_tar(suite)
    remotes = []
    for k in range(slots):
        share = suite.predicate_tasks[k::slots]
        runs = " && ".join(f"(cd {t}/repo && ./run_tests.sh >/dev/null)" for t in share) or "true"
        remotes.append(
            'd=$(mktemp -d /tmp/limit.XXXXXX) && cd "$d" && tar xzf - && '
            f'{{ {runs}; }}; rc=$?; cd / && rm -rf "$d"; exit $rc'
        )
    start = time.perf_counter()
    procs = [
        (h, subprocess.Popen(h.ssh(remote), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE))
        for h in hosts for remote in remotes
    ]
    for _h, p in procs:
        assert p.stdin is not None
        p.stdin.write(payload)
        p.stdin.close()
    errors = []
    for h, p in procs:
        assert p.stderr is not None
        err = p.stderr.read()
        if p.wait() != 0:
            errors.append(f"{h.name}: exit {p.returncode}: {err.decode(errors='replace').strip()}")
    elapsed = time.perf_counter() - start
    if errors:
        raise BaselineError("limit: " + "; ".join(errors))
    return elapsed


def _naive_run_cmd(workdir: str, task: str) -> str:
    # A task with a predicate runs it; a scripted task has nothing to run outside a harness (that is
    # the point of those tasks), so naive only records an exit for it: naive gets less work, not more.
    t = shlex.quote(f"{workdir}/{task}")
    return (f"cd {t} && if [ -x repo/run_tests.sh ]; then ./repo/run_tests.sh > result.txt 2>&1; "
            "else : > result.txt; fi; echo exit=$? >> result.txt")


def run_naive(suite: BenchSuite, hosts: Sequence[BenchHost], local_out: Path) -> float:
    """Per host in sequence, per task: scp the task, ssh run it, scp the result back."""
    workdir = "/tmp/naive-bench"
    start = time.perf_counter()
    for h in hosts:
        dest = local_out / h.name
        dest.mkdir(parents=True, exist_ok=True)
        _check(subprocess.run(h.ssh(f"mkdir -p {workdir}"), capture_output=True), f"naive {h.name} mkdir")
        for task in suite.tasks:
            src = str(suite.root / "tasks" / task)
            _check(subprocess.run(h.scp("-r", src, f"{h.target}:{workdir}/{task}"), capture_output=True),
                   f"naive {h.name} {task} push")
            _check(subprocess.run(h.ssh(_naive_run_cmd(workdir, task)), capture_output=True),
                   f"naive {h.name} {task} run")
            _check(subprocess.run(h.scp(f"{h.target}:{workdir}/{task}/result.txt", str(dest / f"{task}.txt")),
                                  capture_output=True), f"naive {h.name} {task} fetch")
        _check(subprocess.run(h.ssh(f"rm -rf {workdir}"), capture_output=True), f"naive {h.name} cleanup")
    elapsed = time.perf_counter() - start
    for h in hosts:
        for task in suite.tasks:
            text = (local_out / h.name / f"{task}.txt").read_text()
            if "exit=0" not in text:
                raise BaselineError(f"naive {h.name} {task}: result says {text.strip()!r}")
    return elapsed


def ansible_bin() -> Path:
    """ansible-playbook of the bench venv (make bench installs it), else the one on PATH."""
    env_dir = os.environ.get("BENCH_ANSIBLE_VENV")
    # Resolved now: ansible-playbook runs with its scratch directory as cwd.
    candidates = [Path(env_dir).resolve() / "bin" / "ansible-playbook"] if env_dir else []
    candidates.append(Path(__file__).resolve().parent.parent / ".venv-bench" / "bin" / "ansible-playbook")
    for c in candidates:
        if c.exists():
            return c.absolute()
    found = shutil.which("ansible-playbook")
    if found is None:
        raise BaselineError("ansible-playbook not found: run `make bench` (it installs ansible-core "
                            "into .venv-bench) or set BENCH_ANSIBLE_VENV")
    return Path(found)


def write_ansible_inventory(path: Path, hosts: Sequence[BenchHost]) -> Path:
    """An INI inventory; host keys checked against the fleet's known_hosts (never the user's)."""
    lines = ["[bench]"]
    for h in hosts:
        common = (f"-o UserKnownHostsFile={h.known_hosts} -o StrictHostKeyChecking=yes "
                  "-o IdentitiesOnly=yes -o ForwardAgent=no")
        lines.append(
            f"{h.name} ansible_host={h.address} ansible_port={h.port} ansible_user={h.user} "
            f"ansible_ssh_private_key_file={h.identity} ansible_python_interpreter=/usr/bin/python3 "
            f"ansible_ssh_common_args='{common}'"
        )
    path.write_text("\n".join(lines) + "\n")
    return path


def _suite_archive(suite: BenchSuite, path: Path) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        tar.add(suite.root / "tasks", arcname="tasks")
    return path


def _close_control_masters(control_dir: Path) -> None:
    """ControlPersist masters outlive ansible-playbook: end them so no run inherits a warm one."""
    for sock in control_dir.iterdir() if control_dir.exists() else []:
        subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "dummy"],
                       capture_output=True, timeout=10)


def run_ansible(suite: BenchSuite, hosts: Sequence[BenchHost], scratch: Path, *, pipelined: bool) -> float:
    """ansible-playbook bench/ansible/replay.yml: push the suite once, run each task, fetch results."""
    scratch.mkdir(parents=True, exist_ok=True)
    inventory = write_ansible_inventory(scratch / "inventory.ini", hosts)
    archive = _suite_archive(suite, scratch / "suite.tar.gz")
    out_dir = scratch / "fetched"
    control_dir = Path(tempfile.mkdtemp(prefix="ans-cp-", dir="/tmp"))  # short: socket paths are limited
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(scratch),  # ~/.ansible lands in the scratch dir, not the user's home
        "LANG": "C.UTF-8",
        "ANSIBLE_HOME": str(scratch / "ansible-home"),
        "ANSIBLE_CONFIG": str(scratch / "none.cfg"),  # no ansible.cfg from cwd or /etc
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        "ANSIBLE_SSH_CONTROL_PATH_DIR": str(control_dir),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_RETRY_FILES_ENABLED": "False",
    }
    if pipelined:
        env["ANSIBLE_PIPELINING"] = "True"
        env["ANSIBLE_SSH_ARGS"] = "-C -o ControlMaster=auto -o ControlPersist=300s"
    argv = [
        str(ansible_bin()), "-i", str(inventory), str(ANSIBLE_DIR / "replay.yml"),
        "-e", f"suite_archive={archive}", "-e", f"out_dir={out_dir}",
        "-e", "work_dir=/tmp/ansible-bench",
        "-e", "{\"bench_tasks\": [" + ", ".join(f'"{t}"' for t in suite.tasks) + "]}",
    ]
    log = scratch / f"ansible{'-pipelined' if pipelined else ''}.log"
    try:
        start = time.perf_counter()
        with log.open("wb") as f:
            rc = subprocess.run(argv, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=scratch).returncode
        elapsed = time.perf_counter() - start
    finally:
        _close_control_masters(control_dir)
        shutil.rmtree(control_dir, ignore_errors=True)
    if rc != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-5:]
        raise BaselineError(f"ansible (pipelined={pipelined}): exit {rc}; see {log}: {' | '.join(tail)}")
    for h in hosts:
        with tarfile.open(out_dir / f"{h.name}.tar.gz") as tar:
            names = {m.name.lstrip("./") for m in tar.getmembers() if m.isfile()}
        missing = [t for t in suite.tasks if f"{t}/result.txt" not in names]
        if missing:
            raise BaselineError(f"ansible {h.name}: no result for {missing[:3]}")
    return elapsed
