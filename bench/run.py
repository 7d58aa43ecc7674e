"""``make bench``: crosshost against the limit, a naive scp/ssh loop and Ansible, on real sshd hosts.

Starts its own fleet (tools/testhosts.py; free ports picked at start, state under /var/lib/crosshost-bench), runs the
grid (H hosts, T tasks, S ms per predicate), the analysis benchmark, prints the ratio table and writes
``bench/results/<timestamp>.json`` and ``.md``. Stops the fleet on every exit path.

Time budget: crosshost and the limit are measured ``--reps`` times at every grid point first, then the
runner's rows, then ``--reps`` times at every fleet point (whose aftermath would load the small points);
then the analysis; then the slow baselines, in the order that decides the targets (pipelined Ansible at every
point, naive at T=100, naive elsewhere, default Ansible), each once; then further repetitions of them
while the budget lasts. A measurement whose estimated cost does not fit the remaining budget is
skipped and shown as skipped, never guessed. ``--budget-s 0`` means no budget (everything, all reps).

Each measurement, and each of the other benchmarks, starts on a quiet machine (``wait_quiet``: at most
15 % of its CPU busy over half a second, waited for about 30 s at most), so the fleet's start and the
previous command's aftermath land on no tool; the JSON keeps every wait (a grid or fleet measurement's
with its CPU seconds, the other benchmarks' under ``quiet_waits``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import (
    analysis_bench,
    explain_bench,
    history_bench,
    proxy_bench,
    report_html_bench,
    runner_bench,
    stats_bench,
)
from bench.baselines import BaselineError, BenchHost, ansible_bin, run_ansible, run_limit, run_naive
from bench.gen_suite import BenchSuite, generate_suite

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tools/ is a plain directory, not an installed package
from tools.testhosts import Fleet, TestHostError, free_ports  # noqa: E402

GRID = ((2, 12), (2, 100), (8, 12))
SLEEPS = (0, 50)
TOOLS = ("limit", "crosshost", "naive", "ansible", "ansible_pipelined")
Point = tuple[int, int, int]  # (hosts, tasks, sleep_ms)
#: fleet points, crosshost against the limit of the same parallelism only: (hosts, tasks, sleep_ms, slots)
FLEET = ((32, 100, 0, 1), (128, 12, 0, 1), (8, 100, 200, 4))
FleetPoint = tuple[int, int, int, int]


@dataclass
class Cell:
    """All measurements of one tool at one grid point."""

    seconds: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    skipped: str | None = None
    extra: list[dict[str, Any]] = field(default_factory=list)
    #: what the whole machine's CPUs did during each measurement (``MachineCpu.since``)
    machine: list[dict[str, float]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        s = sorted(self.seconds)
        return {
            "n": len(s), "seconds": [round(x, 3) for x in self.seconds],
            "median": round(statistics.median(s), 3) if s else None,
            "min": round(s[0], 3) if s else None, "max": round(s[-1], 3) if s else None,
            "errors": self.errors, "skipped": self.skipped if not s else None, "extra": self.extra,
            "machine": self.machine, "steal_share_median": self.steal_share(),
        }

    def steal_share(self) -> float | None:
        """The median share of the machine's CPU time the hypervisor took during a measurement."""
        shares = [share for share in map(_steal_share, self.machine) if share is not None]
        return round(statistics.median(shares), 3) if shares else None

    @property
    def median(self) -> float | None:
        return statistics.median(self.seconds) if self.seconds else None


class MachineCpu:
    """The machine's CPU time by kind, from ``/proc/stat``'s ``cpu`` line: a measurement's neighbours
    (other processes, the hypervisor's steal) are read beside its wall time, never guessed."""

    def __init__(self) -> None:
        self.ticks = self._read()

    @staticmethod
    def _read() -> list[int]:
        try:
            with open("/proc/stat") as fh:
                first = fh.readline().split()
        except OSError:
            return []
        return [int(x) for x in first[1:9]] if len(first) >= 9 and first[0] == "cpu" else []

    def since(self) -> dict[str, float]:
        """CPU seconds since this snapshot, all CPUs together: busy (user, nice, system, irq, softirq),
        idle (with iowait), the hypervisor's steal, and their total; empty without ``/proc/stat``."""
        now = self._read()
        if not now or not self.ticks:
            return {}
        user, nice, system, idle, iowait, irq, softirq, steal = (b - a for a, b in zip(self.ticks, now, strict=True))
        hz = os.sysconf("SC_CLK_TCK")
        out = {"busy_s": user + nice + system + irq + softirq, "idle_s": idle + iowait, "steal_s": steal}
        out["total_s"] = sum(out.values())
        return {k: round(v / hz, 2) for k, v in out.items()}


#: a measurement starts once the machine's CPUs were this idle over one window (the bench's own set-up and
#: the previous command's aftermath, such as sshd sessions ending and the kernel freeing namespaces, then
#: land on no tool), or after about ``QUIET_MAX_S`` in any case
QUIET_BUSY_SHARE = 0.15
QUIET_WINDOW_S = 0.5
QUIET_MAX_S = 30.0


def wait_quiet(*, busy_share: float = QUIET_BUSY_SHARE, window_s: float = QUIET_WINDOW_S,
               max_s: float = QUIET_MAX_S, sleep: Callable[[float], None] = time.sleep,
               clock: Callable[[], float] = time.monotonic) -> dict[str, float]:
    """Wait until one ``window_s`` window of the machine's CPU time (all CPUs, steal not counted as
    busy) was at most ``busy_share`` busy, or until ``max_s`` passed (plus the window under way): what
    was waited (``quiet_wait_s``), the last window's busy share (``busy_before``) and whether it was
    quiet (``quiet``: False when the wait gave up); empty without ``/proc/stat``."""
    started = clock()
    while True:
        cpu = MachineCpu()
        if not cpu.ticks:
            return {}
        sleep(window_s)
        window = cpu.since()
        share = window["busy_s"] / window["total_s"] if window.get("total_s") else 0.0
        waited = clock() - started
        if share <= busy_share or waited >= max_s:
            return {"quiet_wait_s": round(waited, 2), "busy_before": round(share, 3), "quiet": share <= busy_share}


def _steal_share(machine: dict[str, float]) -> float | None:
    """The share of the machine's CPU time the hypervisor took during one measurement (``MachineCpu.since``)."""
    return machine["steal_s"] / machine["total_s"] if machine.get("total_s") else None


def _steal_note(machine: dict[str, float]) -> str:
    """The printed line's note: the steal, and a wait for a quiet machine that was long or gave up."""
    share = _steal_share(machine)
    said = [] if share is None else [f"steal {share:.0%}"]
    if machine.get("quiet") is False:
        said.append(f"machine {machine['busy_before']:.0%} busy before it: waited {machine['quiet_wait_s']:.0f} s, no quieter")
    elif machine.get("quiet_wait_s", 0.0) >= 2:
        said.append(f"waited {machine['quiet_wait_s']:.0f} s for a quiet machine")
    return f"  ({', '.join(said)})" if said else ""


def _children_cpu_s() -> float:
    """The CPU seconds of this process's children that have ended and been waited for."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def _timed(cell: Cell, label: str, run: Callable[[], float], quiet: dict[str, float]) -> float | None:
    """One measurement of ``cell``, started once the machine was quiet (``quiet``: that wait): its
    seconds and the machine's CPU over the command's window are kept and printed after ``label``; a
    failure is kept and printed instead (None). ``command_cpu_s``: the CPU of the command's own
    processes on this side (a replay's one process; the limit's or Ansible's ``ssh`` clients), which the
    bench starts and waits for; the rest of ``busy_s`` is the hosts' side (their ``sshd`` and what runs
    there) and anything else the machine did.

    What the command wrote (its scratch: a replay's run directory) stays until the bench ends, as a
    user's run directories stay after a replay. Removed between measurements, a fleet point's thousands
    of files were in front of the next measurement's file creations: on a disk file system without a
    journal (this machine's root) each new file looks past the inodes freed in the last minutes."""
    cpu, children = MachineCpu(), _children_cpu_s()
    try:
        seconds = run()
        machine = {**cpu.since(), **quiet, "command_cpu_s": round(_children_cpu_s() - children, 2)}
    except (BaselineError, OSError) as exc:
        cell.errors.append(str(exc)[:500])
        print(f"  {label}  FAILED: {str(exc)[:300]}", flush=True)
        return None
    cell.seconds.append(seconds)
    cell.machine.append(machine)
    print(f"  {label}  {seconds:7.2f} s{_steal_note(machine)}", flush=True)
    return seconds


def cpu_reference_ms(reps: int = 5) -> float:
    """The median milliseconds of one fixed pure-Python loop on one core (taken after ``wait_quiet``):
    how fast this machine's CPU was during the run. The same hardware has measured between 59 and 90 ms
    within one hour with no steal reported; a target with an absolute allowance (limit + 0.4 s) moves
    with it, so each run's results are read beside its reference."""
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        sum(i * i for i in range(1_000_000))
        times.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(times), 1)


def machine_info() -> dict[str, Any]:
    mem_kb = 0
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    ssh_v = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip()
    host_py = subprocess.run(["/usr/bin/python3", "--version"], capture_output=True, text=True).stdout.strip()
    try:
        ans = subprocess.run([str(ansible_bin()), "--version"], capture_output=True, text=True).stdout
        ansible_v = ans.splitlines()[0] if ans else None
    except BaselineError:
        ansible_v = None
    return {
        "nproc": os.cpu_count(), "mem_gib": round(mem_kb / 1024 / 1024, 1),
        "cpu": _cpu_model(), "kernel": platform.release(), "python": platform.python_version(),
        "host_python": host_py, "openssh": ssh_v, "ansible": ansible_v,
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "cpu_reference_quiet_at_start": wait_quiet(),
        "cpu_reference_ms_at_start": cpu_reference_ms(),
    }


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


_REPLAY_API = """
import sys
from pathlib import Path
from orchestrator.commands.replay import ReplayRequest, replay
out = replay(ReplayRequest(suite_dir=Path(sys.argv[1]), inventory_path=Path(sys.argv[2]), out=Path(sys.argv[3])))
sys.exit(out.exit_code)
"""


def compile_sources() -> None:
    """Byte-compile crosshost's own modules, as installing it does. An editable checkout under
    PYTHONDONTWRITEBYTECODE (set in some shells) would otherwise compile every module changed since
    its last .pyc again in every measured ``crosshost`` start: a few tenths of a second that no
    installed crosshost pays."""
    import compileall

    for package in ("orchestrator", "agent_runner"):
        compileall.compile_dir(REPO / package, quiet=1)


def crosshost_entry() -> str:
    """"cli" when `crosshost replay` exists, else "api" (orchestrator.commands.replay.replay in a child)."""
    exe = Path(sys.executable).with_name("crosshost")
    proc = subprocess.run([str(exe), "replay", "--help"], capture_output=True, text=True)
    return "cli" if proc.returncode == 0 else "api"


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.deadline = time.monotonic() + args.budget_s if args.budget_s > 0 else math.inf
        self.cells: dict[tuple[Point, str], Cell] = {}
        self.scratch = Path(tempfile.mkdtemp(prefix="crosshost-bench-"))
        self.fleet = Fleet(args.state)
        most = max([h for h, _ in args.grid] + [f[0] for f in args.fleet])
        self.names = [f"bench-{i:02d}" for i in range(most)]
        self.fleet_cells: dict[tuple[FleetPoint, str], Cell] = {}
        #: the wait for a quiet machine before each benchmark that is not a grid or fleet measurement
        self.quiet_waits: dict[str, dict[str, float]] = {}
        self.suites: dict[Point, BenchSuite] = {}
        self.unit_cost: dict[str, float] = {"naive": 0.75, "ansible": 0.35, "ansible_pipelined": 0.3}
        self.crosshost_via = crosshost_entry()
        self.explain: dict[str, Any] | None = None
        self.runner: dict[str, Any] | None = None
        self.stats: dict[str, Any] | None = None
        self.proxy: dict[str, Any] | None = None
        self.history: dict[str, Any] | None = None

    # -- hosts and inputs -------------------------------------------------------------------
    def hosts(self, count: int) -> list[BenchHost]:
        return [BenchHost(n, "127.0.0.1", self.fleet.hosts[n].port, "root", self.fleet.identity,
                          self.fleet.known_hosts) for n in self.names[:count]]

    def inventory(self, count: int, slots: int = 1) -> Path:
        path = self.scratch / f"hosts-{count}-s{slots}.toml"
        if not path.exists():
            extra: dict[str, object] = {"slots": slots} if slots > 1 else {}
            self.fleet.write_inventory(path, self.names[:count], include_local=False, extra_defaults=extra)
        return path

    def suite(self, point: Point) -> BenchSuite:
        if point not in self.suites:
            _, tasks, sleep_ms = point
            self.suites[point] = generate_suite(self.scratch / f"suite-T{tasks}-S{sleep_ms}", tasks, sleep_ms,
                                                name=f"bench-t{tasks}-s{sleep_ms}")
        return self.suites[point]

    # -- one measurement ----------------------------------------------------------------------
    def work_units(self, tool: str, point: Point) -> float:
        h, t, _ = point
        if tool == "naive":
            return h * t
        return t * math.ceil(h / 5) + 10  # Ansible: forks 5; a loop item per task; ~10 fixed module calls

    def estimate(self, tool: str, point: Point) -> float:
        if tool in ("limit", "crosshost"):
            return 5.0
        return self.unit_cost[tool] * self.work_units(tool, point)

    def settle(self, stage: str) -> dict[str, float]:
        """``wait_quiet`` before ``stage`` (kept in the JSON's ``quiet_waits``; a wait that gave up is said)."""
        quiet = self.quiet_waits[stage] = wait_quiet()
        if quiet.get("quiet") is False:
            print(f"  {stage}: the machine stayed {quiet['busy_before']:.0%} busy for {quiet['quiet_wait_s']:.0f} s;"
                  " measured anyway", flush=True)
        return quiet

    def measure(self, point: Point, tool: str) -> None:
        cell = self.cells.setdefault((point, tool), Cell())
        if cell.errors and not cell.seconds:
            return  # it failed here once: repeating it measures nothing and costs the budget
        h, t, s = point
        suite, hosts = self.suite(point), self.hosts(h)
        quiet = wait_quiet()  # before the budget's check: the wait is spent either way
        left = self.deadline - time.monotonic()
        est = self.estimate(tool, point)
        if est > left:
            if not cell.seconds:
                cell.skipped = f"time budget (estimated {est:.0f} s, {max(left, 0):.0f} s left)"
            return
        scratch = self.scratch / f"{tool}-H{h}-T{t}-S{s}-{len(cell.seconds) + len(cell.errors)}"
        runners: dict[str, Callable[[], float]] = {
            "limit": lambda: run_limit(suite, hosts),
            "naive": lambda: run_naive(suite, hosts, scratch),
            "ansible": lambda: run_ansible(suite, hosts, scratch, pipelined=False),
            "ansible_pipelined": lambda: run_ansible(suite, hosts, scratch, pipelined=True),
            "crosshost": lambda: self.run_crosshost(point, scratch, cell),
        }
        seconds = _timed(cell, f"{tool:<18} H={h} T={t:<3} S={s:<2}", runners[tool], quiet)
        if seconds is not None and tool in self.unit_cost:
            self.unit_cost[tool] = seconds / self.work_units(tool, point)

    def measure_fleet(self, fp: FleetPoint, tool: str) -> None:
        """A fleet point: crosshost (``slots`` per host) or the limit with the same parallelism."""
        h, t, s, slots = fp
        cell = self.fleet_cells.setdefault((fp, tool), Cell())
        if cell.errors and not cell.seconds:
            return
        point = (h, t, s)
        scratch = self.scratch / f"fleet-{tool}-H{h}-T{t}-S{s}-P{slots}-{len(cell.seconds) + len(cell.errors)}"
        suite, hosts = self.suite(point), self.hosts(h)  # made outside the measured window
        run: Callable[[], float] = ((lambda: run_limit(suite, hosts, slots=slots)) if tool == "limit"
                                    else (lambda: self.run_crosshost(point, scratch, cell, slots=slots)))
        _timed(cell, f"{tool:<18} H={h} T={t:<3} S={s:<3} slots={slots}", run, wait_quiet())

    def run_crosshost(self, point: Point, scratch: Path, cell: Cell, *, slots: int = 1) -> float:
        """``crosshost replay SUITE -i hosts.toml``: the whole command, as a user runs it."""
        h, t, _ = point
        suite = self.suite(point)
        runs = scratch / "runs"
        inventory = self.inventory(h, slots)
        if self.crosshost_via == "cli":
            exe = Path(sys.executable).with_name("crosshost")
            argv = [str(exe), "replay", str(suite.root), "-i", str(inventory), "--out", str(runs)]
        else:  # until the CLI command exists: the same replay() in a fresh interpreter
            argv = [sys.executable, "-c", _REPLAY_API, str(suite.root), str(inventory), str(runs)]
        start = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=scratch.parent)
        seconds = time.perf_counter() - start
        if proc.returncode not in (0, 1):
            raise BaselineError(f"crosshost replay exit {proc.returncode}: {proc.stderr.strip()[-400:]}")
        run_dirs = [p for p in runs.iterdir() if p.is_dir() and not p.name.startswith(".")] if runs.exists() else []
        if len(run_dirs) != 1:
            raise BaselineError(f"crosshost replay left {len(run_dirs)} run directories in {runs}")
        rows = [json.loads(x) for x in (run_dirs[0] / "results.jsonl").read_text().splitlines() if x.strip()]
        bad = [r for r in rows if r.get("verdict") != "pass"]
        if len(rows) != h * t or bad:
            raise BaselineError(f"crosshost replay: {len(rows)} result rows (want {h * t}), "
                                f"{len(bad)} not pass, e.g. {bad[:1]}; exit {proc.returncode}")
        manifest = json.loads((run_dirs[0] / "manifest.json").read_text())
        cell.extra.append({"exit": proc.returncode,
                           "stages": {n: r.get("stages") for n, r in manifest.get("hosts", {}).items()}})
        return seconds

    # -- the plan -----------------------------------------------------------------------------
    def points(self) -> list[Point]:
        return [(h, t, s) for h, t in self.args.grid for s in self.args.sleeps]

    def run(self) -> dict[str, Any]:
        info = machine_info()
        print(f"crosshost measured via: {self.crosshost_via}", flush=True)
        print(f"machine: {info['nproc']} cores, {info['mem_gib']} GiB, Python {info['python']}, "
              f"kernel {info['kernel']}, load {info['loadavg_at_start']}, "
              f"CPU reference {info['cpu_reference_ms_at_start']} ms (bench.run.cpu_reference_ms)", flush=True)
        started = time.monotonic()
        tools = self.args.tools
        fast = [x for x in ("limit", "crosshost") if x in tools]
        # The grid's repetitions and the runner's rows first, the fleet points after them: a fleet point
        # leaves the kernel seconds of work (freeing thousands of attempts' namespaces, which every new
        # namespace then waits on), so a small point measured right after one paid for the fleet's.
        # Within each point the two tools alternate which goes first, so both see the same drift.
        for rep in range(self.args.reps):
            for point in self.points():
                for tool in fast if rep % 2 == 0 else fast[::-1]:  # alternate order: no tool always goes first
                    self.measure(point, tool)
        if self.args.runner_tasks:
            self.settle("runner")
            self.runner = self.run_runner()
        for rep in range(self.args.reps):
            for fp in self.args.fleet:
                for tool in fast if rep % 2 == 0 else fast[::-1]:
                    self.measure_fleet(fp, tool)
        analysis: dict[str, Any] | None = None
        if self.args.analysis_lines > 0:
            self.settle("analysis")
            analysis = self.run_analysis()
        report_html: dict[str, Any] | None = None
        if self.args.html_tasks > 0:
            self.settle("report.html")
            report_html = self.run_report_html()
        if self.args.explain_reps > 0:
            self.settle("explain")
            self.explain = self.run_explain()
        if self.args.stats_runs > 0:
            self.settle("statistics")
            print(f"  statistics: seeded simulations of the suite-wide rule, {self.args.stats_runs} runs ...", flush=True)
            self.stats = stats_bench.measure(self.args.stats_runs)
        if self.args.proxy_requests > 0:
            self.settle("proxy")  # the last fleet point's aftermath (its sshd sessions, its namespaces) first
            self.proxy = self.run_proxy()
        if self.args.history_runs > 1:
            self.settle("history")
            print(f"  history: a replay after its hosts with 1 and {self.args.history_runs} runs in the index ...", flush=True)
            self.history = history_bench.measure(self.args.history_runs)
        # The order that decides the targets first: the faster Ansible everywhere, naive at T=100 (the
        # 5x target) at the larger S, default Ansible, then the naive points that only inform.
        pts = self.points()
        naive_first = [p for p in pts if p[1] == 100 and p[2] == max(self.args.sleeps)]
        slow_order: list[tuple[Point, str]] = [(p, "ansible_pipelined") for p in pts]
        slow_order += [(p, "naive") for p in naive_first] + [(p, "ansible") for p in pts]
        slow_order += [(p, "naive") for p in sorted(pts, key=lambda p: p[0] * p[1]) if p not in naive_first]
        slow_order = [(p, t) for p, t in slow_order if t in tools]
        for _ in range(self.args.slow_reps):
            for point, tool in slow_order:
                self.measure(point, tool)
        return self.result(info, analysis, time.monotonic() - started, report_html)

    def run_report_html(self) -> dict[str, Any]:
        tasks, hosts = self.args.html_tasks, 4
        print(f"  report.html: {tasks} tasks x {hosts} hosts x 2 attempts in headless Chromium ...", flush=True)
        out = report_html_bench.measure(tasks, hosts, attempts=2, reps=3)
        print(f"  report.html: interactive in {out['wall_to_ready_median_s']:.2f} s (target < "
              f"{out['target_s']:.0f} s), task view {out['open_task_median_s']:.3f} s, "
              f"page {out['page_mb']} MB written in {out['render_s']:.2f} s", flush=True)
        return out

    def run_explain(self) -> dict[str, Any]:
        print(f"  explain: the demo's three flipped tasks, {self.args.explain_reps} rep(s) ...", flush=True)
        out = explain_bench.measure(self.args.explain_reps)
        print(f"  explain: {out['explain_median_s']:.2f} s against a replay of those tasks in "
              f"{out['replay_median_s']:.2f} s (bound 3 x replay + 2 s = {out['bound_s']:.2f} s)", flush=True)
        return out

    def run_proxy(self) -> dict[str, Any]:
        streams = tuple(self.args.proxy_streams)
        print(f"  proxy: {self.args.proxy_requests} request pairs direct/proxied, then {streams} streams at once ...",
              flush=True)
        out = proxy_bench.measure(self.args.proxy_requests, streams)
        waves = ", ".join(f"K={w['streams']}: {w['complete']} whole" for w in out["waves"])
        print(f"  proxy: adds {out['max_added_median_ms']:.2f} ms median at most (target <= "
              f"{proxy_bench.TARGET_ADDED_MS} ms); {waves}", flush=True)
        return out

    def run_runner(self) -> dict[str, Any]:
        sizes = tuple(self.args.runner_tasks)
        print(f"  runner: per-attempt overhead on no-op suites of {sizes} tasks ...", flush=True)
        out = runner_bench.measure(sizes, reps=3)
        print(f"  runner: {', '.join(f'{t} tasks {ms} ms' for t, ms in out['per_attempt_ms'].items())} per attempt "
              f"({out['isolation']}; target <= {out['target_ms']} ms, flat); start-up {out['start_ms']['source']} ms "
              f"(from runner.pyz {out['start_ms']['zipapp']} ms)", flush=True)
        return out

    def run_analysis(self) -> dict[str, Any]:
        lines = self.args.analysis_lines
        print(f"  analysis: writing a run of {lines} trace lines ...", flush=True)
        run_dir = analysis_bench.make_run_dir(self.scratch / "analysis", lines)
        out = analysis_bench.measure(run_dir, reps=self.args.analysis_reps)
        shutil.rmtree(self.scratch / "analysis", ignore_errors=True)
        print(f"  analysis: analyse_run {out['analyse_median_s']:.2f} s vs json-parse "
              f"{out['json_limit_median_s']:.2f} s, peak RSS {out['analyse_peak_rss_mb']:.0f} MB", flush=True)
        return out

    # -- results ------------------------------------------------------------------------------
    def result(
        self, info: dict[str, Any], analysis: dict[str, Any] | None, wall_s: float,
        report_html: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        points = []
        for point in self.points():
            h, t, s = point
            med = {tool: (self.cells[(point, tool)].median if (point, tool) in self.cells else None)
                   for tool in TOOLS}
            points.append({
                "hosts": h, "tasks": t, "sleep_ms": s,
                "tools": {tool: self.cells[(point, tool)].summary() for tool in TOOLS if (point, tool) in self.cells},
                "ratios": ratios(med), "targets": targets(point, med),
            })
        self.settle("cpu reference at the end")  # kept under quiet_waits
        reference_at_end = cpu_reference_ms()
        return {
            "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "machine": info, "wall_s": round(wall_s, 1),
            "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
            "cpu_reference_ms_at_end": reference_at_end,
            "quiet_waits": self.quiet_waits,
            "crosshost_via": self.crosshost_via,
            "settings": {"reps": self.args.reps, "slow_reps": self.args.slow_reps,
                         "budget_s": self.args.budget_s, "grid": self.args.grid, "sleeps": self.args.sleeps},
            "points": points, "analysis": analysis, "report_html": report_html,
            "explain": self.explain, "runner": self.runner,
            "statistics": self.stats, "proxy": self.proxy, "history": self.history,
            "fleet_points": self.fleet_result(),
        }

    def fleet_result(self) -> list[dict[str, Any]]:
        out = []
        for fp in self.args.fleet:
            h, t, s, slots = fp
            tools = {tool: self.fleet_cells[(fp, tool)] for tool in ("limit", "crosshost") if (fp, tool) in self.fleet_cells}
            c = tools["crosshost"].median if "crosshost" in tools else None
            lim = tools["limit"].median if "limit" in tools else None
            out.append({
                "hosts": h, "tasks": t, "sleep_ms": s, "slots": slots,
                "tools": {tool: cell.summary() for tool, cell in tools.items()},
                "cpu_ms_a_host": {tool: _cpu_a_host(cell, h) for tool, cell in tools.items()},
                "ratios": {"crosshost/limit": _ratio(c, lim)},
                "targets": {"within_1.3x_limit_plus_1s": (c <= 1.3 * lim + 1.0) if c is not None and lim is not None else None},
            })
        return out

    def close(self) -> None:
        self.fleet.down()
        shutil.rmtree(self.scratch, ignore_errors=True)


def _cpu_a_host(cell: Cell, hosts: int) -> dict[str, float | None]:
    """A fleet point's CPU a host, medians over its measurements: ``controller`` the command's own
    processes on this machine's side (``_timed``'s ``command_cpu_s``), ``hosts`` the rest of the
    machine's busy time (each host's ``sshd`` and what runs under it, the kernel's work for them)."""
    ours = [m["command_cpu_s"] for m in cell.machine if "command_cpu_s" in m]
    rest = [m["busy_s"] - m["command_cpu_s"] for m in cell.machine if "command_cpu_s" in m and "busy_s" in m]
    return {"controller": round(statistics.median(ours) * 1000 / hosts, 1) if ours else None,
            "hosts": round(statistics.median(rest) * 1000 / hosts, 1) if rest else None}


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


def ratios(med: Mapping[str, float | None]) -> dict[str, float | None]:
    c = med.get("crosshost")
    return {"crosshost/limit": _ratio(c, med.get("limit")), "naive/crosshost": _ratio(med.get("naive"), c),
            "ansible/crosshost": _ratio(med.get("ansible"), c),
            "ansible_pipelined/crosshost": _ratio(med.get("ansible_pipelined"), c)}


def targets(point: Point, med: Mapping[str, float | None]) -> dict[str, bool | None]:
    """None: not measured at this point (or not a target here)."""
    c, lim = med.get("crosshost"), med.get("limit")
    out: dict[str, bool | None] = {
        "within_1.3x_limit_plus_1s": (c <= 1.3 * lim + 1.0) if c is not None and lim is not None else None,
        # the smallest point: crosshost's fixed cost alone, so a tighter bound
        "within_limit_plus_0.4s": (c <= lim + 0.4) if point == (2, 12, 0) and c is not None and lim is not None
        else None,
    }
    naive = med.get("naive")
    out["5x_faster_than_naive"] = (naive >= 5 * c if c is not None and naive is not None else None) \
        if point[1] == 100 else None
    ans = [med.get("ansible"), med.get("ansible_pipelined")]
    measured = [a for a in ans if a is not None]
    out["faster_than_ansible"] = all(c < a for a in measured) if c is not None and measured else None
    return out


def _also(ok: bool | None) -> str:
    """The (2, 12, 0) point's second bound, beside the first."""
    return "" if ok is None else f"; ≤limit+0.4s: {_mark(ok)}"


def _fmt(x: float | None, unit: str = "") -> str:
    return "—" if x is None else f"{x:.2f}{unit}"


def _mark(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "MISSED")


def _per_host(point: dict[str, Any], side: str) -> str:
    """A fleet row's CPU a host on one ``side`` (``_cpu_a_host``), the limit's then crosshost's."""
    cpu = point.get("cpu_ms_a_host") or {}
    shown = [(cpu.get(tool) or {}).get(side) for tool in ("limit", "crosshost")]
    return " / ".join("—" if x is None else f"{x:.0f}" for x in shown)


def _steal_lines(points: list[dict[str, Any]]) -> list[str]:
    """Below a table: the hypervisor's median share of the machine's CPU while each point's limit and
    crosshost ran (a miss measured under steal says so beside it)."""
    said = []
    for p in points:
        shares = {tool: (p["tools"].get(tool) or {}).get("steal_share_median") for tool in ("limit", "crosshost")}
        if any(v is not None for v in shares.values()):
            slots = f", {p['slots']} slots" if p.get("slots", 1) > 1 else ""
            said.append(f"({p['hosts']}, {p['tasks']}, {p['sleep_ms']}{slots}) "
                        + ", ".join(f"{tool} {v:.0%}" for tool, v in shares.items() if v is not None))
    return ["", "Steal during the measurements (median share of the machine's CPU time): " + "; ".join(said)] if said else []


def render_table(result: dict[str, Any]) -> str:
    """The Markdown table printed by make bench and pasted into BENCHMARKS.md."""
    lines = [
        "| H | T | S ms | limit s | crosshost s | naive s | ansible s | ansible pipelined s "
        "| crosshost/limit | naive/crosshost | ansible/crosshost | ansible-pipelined/crosshost "
        "| ≤1.3×limit+1s | ≥5× naive (T=100) | < Ansible |",
        "|" + "---|" * 15,
    ]
    for p in result["points"]:
        tools = p["tools"]

        def cell(tool: str, tools: dict[str, Any] = tools) -> str:
            c = tools.get(tool)
            if not c or c["median"] is None:
                return "skipped" if c and c.get("skipped") else ("failed" if c and c["errors"] else "—")
            spread = f" ({c['min']:.2f}–{c['max']:.2f}, n={c['n']})" if c["n"] > 1 else " (n=1)"
            return f"{c['median']:.2f}{spread}"

        r, tg = p["ratios"], p["targets"]
        lines.append(
            f"| {p['hosts']} | {p['tasks']} | {p['sleep_ms']} | {cell('limit')} | {cell('crosshost')} "
            f"| {cell('naive')} | {cell('ansible')} | {cell('ansible_pipelined')} "
            f"| {_fmt(r['crosshost/limit'], '×')} | {_fmt(r['naive/crosshost'], '×')} "
            f"| {_fmt(r['ansible/crosshost'], '×')} | {_fmt(r['ansible_pipelined/crosshost'], '×')} "
            f"| {_mark(tg['within_1.3x_limit_plus_1s'])}{_also(tg.get('within_limit_plus_0.4s'))} "
            f"| {_mark(tg['5x_faster_than_naive'])} "
            f"| {_mark(tg['faster_than_ansible'])} |"
        )
    lines += _steal_lines(result["points"])
    fleet = result.get("fleet_points") or []
    if fleet:
        lines += ["", "| H | T | S ms | slots | limit s (same parallelism) | crosshost s | crosshost/limit | ≤1.3×limit+1s "
                  "| CPU a host, this side ms (limit / crosshost) | CPU a host, the hosts' side ms (limit / crosshost) |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for p in fleet:
            def fcell(tool: str, tools: dict[str, Any] = p["tools"]) -> str:
                c = tools.get(tool)
                if not c or c["median"] is None:
                    return "failed" if c and c["errors"] else "—"
                spread = f" ({c['min']:.2f}–{c['max']:.2f}, n={c['n']})" if c["n"] > 1 else " (n=1)"
                return f"{c['median']:.2f}{spread}"

            lines.append(
                f"| {p['hosts']} | {p['tasks']} | {p['sleep_ms']} | {p['slots']} | {fcell('limit')} | {fcell('crosshost')} "
                f"| {_fmt(p['ratios']['crosshost/limit'], '×')} | {_mark(p['targets']['within_1.3x_limit_plus_1s'])} "
                f"| {_per_host(p, 'controller')} | {_per_host(p, 'hosts')} |"
            )
        lines += _steal_lines(fleet)
    a = result.get("analysis")
    if a:
        lines += [
            "",
            "| analysis | lines | analyse_run s | json-parse limit s | ratio | peak RSS MB | ≤2× limit, RSS<300 MB |",
            "|---|---|---|---|---|---|---|",
            f"| analyse_run | {a['lines']:,} | {a['analyse_median_s']:.2f} | {a['json_limit_median_s']:.2f} "
            f"| {_fmt(a['ratio'], '×')} | {a['analyse_peak_rss_mb']:.0f} | {_mark(a['met'])} |",
        ]
    h = result.get("report_html")
    if h:
        lines += [
            "",
            "| report.html | cells | page MB | written s | interactive s | task view s | filter s | < 2 s |",
            "|---|---|---|---|---|---|---|---|",
            f"| {h['tasks']} tasks x {h['hosts']} hosts x {h['attempts']} | {h['cells']:,} | {h['page_mb']} "
            f"| {h['render_s']:.2f} | {h['wall_to_ready_median_s']:.2f} | {h['open_task_median_s']:.3f} "
            f"| {h['filter_median_s']:.3f} | {_mark(h['within_target'])} |",
        ]
    r = result.get("runner")
    if r:
        sizes = [str(t) for t in r["sizes"]]
        lines += [
            "",
            "| runner per attempt (no-op tasks, " + r["isolation"] + ") | "
            + " | ".join(f"{t} tasks ms" for t in sizes) + " | ≤5 ms and flat |",
            "|---|" + "---|" * len(sizes) + "---|",
            f"| (wall(T) - wall(1)) / (T - 1), median of {r['reps']} | "
            + " | ".join(f"{r['per_attempt_ms'][t]:.2f}" for t in sizes) + f" | {_mark(r['met'])} |",
            "",
            "| runner start-up (a 1-task run, wall) | from the source tree ms | from runner.pyz, as on a host ms |",
            "|---|---|---|",
            f"| median of {r['reps']} | {r['start_ms']['source']:.1f} | {r['start_ms']['zipapp']:.1f} |",
        ]
    e = result.get("explain")
    if e:
        lines += [
            "",
            "| explain (demo, 3 flipped tasks) | replay of those tasks s | explain s | bound 3 x replay + 2 s | met |",
            "|---|---|---|---|---|",
            f"| median of {len(e['explain_s'])} | {e['replay_median_s']:.2f} | {e['explain_median_s']:.2f} "
            f"| {e['bound_s']:.2f} | {_mark(e['met'])} |",
        ]
    lines += stats_bench.markdown(result.get("statistics"))
    lines += proxy_bench.markdown(result.get("proxy"))
    lines += history_bench.markdown(result.get("history"))
    return "\n".join(lines)


def _grid(text: str) -> list[tuple[int, int]]:
    out = []
    for item in text.split(","):
        h, _, t = item.partition("x")
        out.append((int(h), int(t)))
    return out


def _fleet(text: str) -> list[FleetPoint]:
    out: list[FleetPoint] = []
    for item in (x for x in text.split(",") if x):
        h, t, s, slots = (int(v) for v in item.split("x"))
        out.append((h, t, s, slots))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--grid", type=_grid, default=list(GRID), help="HxT,HxT,... (default 2x12,2x100,8x12)")
    p.add_argument("--sleeps", type=lambda s: [int(x) for x in s.split(",")], default=list(SLEEPS))
    p.add_argument("--fleet", type=_fleet, default=list(FLEET),
                   help="HxTxSxSLOTS,... fleet points, crosshost and the limit only (default 32x100x0x1,128x12x0x1,8x100x200x4; '' for none)")
    p.add_argument("--tools", type=lambda s: s.split(","), default=list(TOOLS))
    p.add_argument("--reps", type=int, default=3, help="repetitions of crosshost and the limit")
    p.add_argument("--slow-reps", type=int, default=3, help="repetitions of naive/Ansible, budget permitting")
    p.add_argument("--budget-s", type=float, default=510, help="measurement budget in seconds; 0: none")
    p.add_argument("--analysis-lines", type=int, default=1_000_000)
    p.add_argument("--analysis-reps", type=int, default=1)
    p.add_argument("--html-tasks", type=int, default=2000, help="report.html benchmark tasks (x 4 hosts); 0: skip")
    p.add_argument("--runner-tasks", type=lambda s: [int(x) for x in s.split(",") if x], default=[100, 1000],
                   help="suite sizes of the runner's per-attempt overhead (no-op tasks); '' to skip")
    p.add_argument("--explain-reps", type=int, default=3, help="explain benchmark repetitions (the demo's flips); 0: skip")
    p.add_argument("--stats-runs", type=int, default=1000, help="seeded simulations of the statistics; 0: skip")
    p.add_argument("--history-runs", type=int, default=500,
                   help="a replay after its hosts with 1 and this many runs in the history index; 0: skip")
    p.add_argument("--proxy-requests", type=int, default=300,
                   help="model proxy: request pairs (direct, proxied) per kind; 0: skip the proxy benchmark")
    p.add_argument("--proxy-streams", type=lambda s: [int(x) for x in s.split(",") if x], default=list(proxy_bench.STREAMS),
                   help="model proxy: streamed answers at once, one wave each (default 64,128,256,512)")
    # not under /var/tmp: the hosts share the machine's /var/tmp, and every runner walks it at its start
    # (its stray-file baseline): a host would walk its neighbours' homes there, which no real host has
    p.add_argument("--state", type=Path, default=Path("/var/lib/crosshost-bench"))
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = p.parse_args(argv)
    unknown = set(args.tools) - set(TOOLS)
    if unknown:
        p.error(f"unknown tools {sorted(unknown)}; choose from {', '.join(TOOLS)}")

    def _terminate(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")  # stop the fleet in `finally`, as on Ctrl-C

    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, _terminate)  # also when started in the background (SIGINT ignored)
    compile_sources()
    bench = Bench(args)
    try:
        bench.fleet.down()
        ports = free_ports(len(bench.names))
        print(f"starting {len(bench.names)} sshd hosts on free ports of 127.0.0.1 ({min(ports)}-{max(ports)}) ...",
              flush=True)
        bench.fleet.up(bench.names, ports)
        result = bench.run()
    except TestHostError as exc:
        print(f"bench: error: test hosts: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bench: interrupted; the test hosts are stopped", file=sys.stderr)
        return 130
    finally:
        bench.close()
    table = render_table(result)
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H%M%SZ")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stamp}.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / f"{stamp}.md").write_text(table + "\n")
    print()
    print(table)
    print(f"\nwall {result['wall_s']:.0f} s; CPU reference {result['machine']['cpu_reference_ms_at_start']} ms at the "
          f"start, {result['cpu_reference_ms_at_end']} ms at the end; results: {args.out / (stamp + '.json')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
