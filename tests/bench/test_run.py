import statistics
import time
from typing import Any

from bench.run import Cell, ratios, render_table, targets


def test_targets_follow_the_issue() -> None:
    med: dict[str, float | None] = {"limit": 1.0, "crosshost": 2.2, "naive": 11.5, "ansible": 5.0,
                                    "ansible_pipelined": 2.0}
    t = targets((2, 100, 0), med)
    assert t["within_1.3x_limit_plus_1s"] is True  # 2.2 <= 1.3 + 1
    assert t["5x_faster_than_naive"] is True  # 11.5 >= 11
    assert t["faster_than_ansible"] is False  # pipelined Ansible 2.0 beats 2.2
    med["crosshost"] = 2.4
    t = targets((2, 100, 0), med)
    assert t["within_1.3x_limit_plus_1s"] is False
    assert t["5x_faster_than_naive"] is False
    assert targets((2, 12, 0), med)["5x_faster_than_naive"] is None  # only a target at T=100
    assert targets((2, 12, 0), {"crosshost": 1.0})["faster_than_ansible"] is None
    assert ratios(med)["naive/crosshost"] == 4.79


def test_table_shows_skipped_and_failed_cells() -> None:
    skipped = Cell(skipped="time budget")
    failed = Cell(errors=["boom"])
    ok = Cell(seconds=[1.0, 3.0, 2.0])
    tools: dict[str, Any] = {"limit": ok.summary(), "crosshost": ok.summary(), "naive": skipped.summary(),
                             "ansible": failed.summary()}
    meds = {k: 2.0 for k in ("limit", "crosshost")}
    result = {"points": [{"hosts": 2, "tasks": 12, "sleep_ms": 0, "tools": tools, "ratios": ratios(meds),
                          "targets": targets((2, 12, 0), meds)}], "analysis": None}
    row = render_table(result).splitlines()[2]
    assert "2.00 (1.00–3.00, n=3)" in row
    assert "skipped" in row and "failed" in row


def test_the_runner_row_measures_a_real_runner_on_no_op_suites_and_shows_each_size() -> None:
    from agent_runner.sandbox import split_level
    from bench import runner_bench

    out = runner_bench.measure((3, 5), reps=1)  # what it says, not how fast: timing is make bench's
    assert out["sizes"] == [3, 5] and set(out["wall_s"]) == {"1", "3", "5"}
    assert split_level(out["isolation"])[0] in ("pidns+uid", "pidns", "none")  # netns+ where the host allows
    assert set(out["per_attempt_ms"]) == {"3", "5"} and isinstance(out["met"], bool)
    table = render_table({"points": [], "analysis": None, "runner": out})
    lines = table.splitlines()
    row = lines[lines.index(next(line for line in lines if "3 tasks ms | 5 tasks ms" in line)) + 2]
    assert f"| {out['per_attempt_ms']['3']:.2f} | {out['per_attempt_ms']['5']:.2f} |" in row
    start = out["start_ms"]
    assert start["source"] == round(statistics.median(out["wall_s"]["1"]) * 1000, 1) and start["zipapp"] > 0
    assert table.splitlines()[-1] == f"| median of 1 | {start['source']:.1f} | {start['zipapp']:.1f} |"


def test_the_smallest_point_has_its_tighter_bound_beside_the_first() -> None:
    assert targets((2, 12, 0), {"limit": 0.2, "crosshost": 0.55})["within_limit_plus_0.4s"] is True
    assert targets((2, 12, 0), {"limit": 0.2, "crosshost": 0.65})["within_limit_plus_0.4s"] is False
    assert targets((2, 100, 0), {"limit": 0.2, "crosshost": 0.55})["within_limit_plus_0.4s"] is None
    ok = Cell(seconds=[0.6]).summary()
    meds = {"limit": 0.2, "crosshost": 0.6}
    result = {"points": [{"hosts": 2, "tasks": 12, "sleep_ms": 0, "tools": {"limit": ok, "crosshost": ok},
                          "ratios": ratios(meds), "targets": targets((2, 12, 0), meds)}], "analysis": None}
    assert "; ≤limit+0.4s: " in render_table(result).splitlines()[2]


def test_every_grid_point_and_the_runner_rows_are_measured_before_any_fleet_point(
        tmp_path: Any, monkeypatch: Any) -> None:
    """A fleet point leaves the kernel seconds of namespaces to free: nothing small is measured after
    one. Within a point the tools alternate which goes first."""
    import argparse
    import shutil

    from bench import run

    monkeypatch.setattr(run, "crosshost_entry", lambda: "cli")
    monkeypatch.setattr(run, "machine_info", lambda: {"nproc": 2, "mem_gib": 1, "python": "3", "kernel": "k",
                                                      "loadavg_at_start": 0.0, "cpu_reference_ms_at_start": 80.0})
    done: list[tuple[str, Any, str]] = []
    monkeypatch.setattr(run.Bench, "measure", lambda self, point, tool: done.append(("grid", point, tool)))
    monkeypatch.setattr(run.Bench, "measure_fleet", lambda self, fp, tool: done.append(("fleet", fp, tool)))
    monkeypatch.setattr(run.Bench, "run_runner", lambda self: done.append(("runner", None, "")) or {})
    monkeypatch.setattr(run.Bench, "result", lambda self, *a: {})
    monkeypatch.setattr(run, "wait_quiet", lambda: {})
    args = argparse.Namespace(grid=[(2, 12), (8, 12)], sleeps=[0], fleet=[(32, 100, 0, 1), (128, 12, 0, 1)],
                              tools=["limit", "crosshost"], reps=3, slow_reps=0, budget_s=0, analysis_lines=0,
                              html_tasks=0, runner_tasks=[100], explain_reps=0, stats_runs=0, history_runs=0,
                              proxy_requests=0, state=tmp_path / "state")
    bench = run.Bench(args)
    try:
        bench.run()
    finally:
        shutil.rmtree(bench.scratch, ignore_errors=True)
    kinds = [kind for kind, _, _ in done]
    assert kinds == ["grid"] * 12 + ["runner"] + ["fleet"] * 12
    assert [tool for _, _, tool in done[:2]] == ["limit", "crosshost"]
    assert [tool for _, _, tool in done[4:6]] == ["crosshost", "limit"]  # the second repetition
    assert [tool for _, _, tool in done[-2:]] == ["limit", "crosshost"]  # the third, at the last fleet point


def test_each_measurement_keeps_what_the_machines_cpus_did_and_the_table_says_the_steal() -> None:
    from bench.run import MachineCpu

    cpu = MachineCpu()
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:  # busy: the machine's busy time grows by at least this
        pass
    seen = cpu.since()
    assert set(seen) == {"busy_s", "idle_s", "steal_s", "total_s"}
    assert seen["busy_s"] >= 0.03 and min(seen.values()) >= 0
    quiet, stolen = Cell(seconds=[1.0]), Cell(seconds=[2.0, 2.2])
    quiet.machine = [{"busy_s": 1.0, "idle_s": 1.0, "steal_s": 0.0, "total_s": 2.0}]
    stolen.machine = [{"busy_s": 1.0, "idle_s": 0.0, "steal_s": 1.0, "total_s": 2.0},
                      {"busy_s": 1.5, "idle_s": 0.0, "steal_s": 0.5, "total_s": 2.0}]
    assert quiet.summary()["steal_share_median"] == 0.0 and stolen.summary()["steal_share_median"] == 0.375
    meds = {"limit": 1.0, "crosshost": 2.1}
    result = {"points": [{"hosts": 2, "tasks": 12, "sleep_ms": 0,
                          "tools": {"limit": quiet.summary(), "crosshost": stolen.summary()},
                          "ratios": ratios(meds), "targets": targets((2, 12, 0), meds)}], "analysis": None}
    assert render_table(result).splitlines()[-1] == (
        "Steal during the measurements (median share of the machine's CPU time): (2, 12, 0) limit 0%, crosshost 38%")


def test_a_measurement_waits_for_a_quiet_machine_and_keeps_the_wait(tmp_path: Any, monkeypatch: Any,
                                                                    capsys: Any) -> None:
    """The wait ends on the first window at most that busy, or gives up after its limit and says so;
    each measurement keeps what was waited and how busy the machine was before it."""
    import argparse
    import shutil

    from bench import run

    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    def windows(*shares: tuple[int, int, int]) -> None:
        """/proc/stat as it reads around each window: (busy, idle, steal) ticks of the window."""
        reads: list[list[int]] = []
        total = [0] * 8  # user, nice, system, idle, iowait, irq, softirq, steal
        for busy, idle, steal in shares:
            reads.append(list(total))
            total[0] += busy // 2
            total[2] += busy - busy // 2
            total[3] += idle
            total[7] += steal
            reads.append(list(total))
        script = iter(reads)
        monkeypatch.setattr(run.MachineCpu, "_read", staticmethod(lambda: next(script)))

    windows((80, 20, 0), (10, 60, 30))  # busy, then quiet (a hypervisor's steal is not this machine busy)
    quiet = run.wait_quiet(window_s=0.5, sleep=sleep, clock=lambda: now[0])
    assert quiet == {"quiet_wait_s": 1.0, "busy_before": 0.1, "quiet": True}
    now[0] = 0.0
    windows(*[(80, 20, 0)] * 10)  # busy throughout: gives up once max_s has passed, and says so
    assert run.wait_quiet(window_s=0.5, max_s=1.5, sleep=sleep, clock=lambda: now[0]) == {
        "quiet_wait_s": 1.5, "busy_before": 0.8, "quiet": False}
    monkeypatch.undo()
    assert run.cpu_reference_ms(reps=3) > 0

    monkeypatch.setattr(run, "crosshost_entry", lambda: "cli")
    monkeypatch.setattr(run, "run_limit", lambda suite, hosts: 0.25)
    monkeypatch.setattr(run.Bench, "suite", lambda self, point: None)
    monkeypatch.setattr(run.Bench, "hosts", lambda self, count: [])
    waits = iter([{"quiet_wait_s": 3.0, "busy_before": 0.05, "quiet": True},
                  {"quiet_wait_s": 30.0, "busy_before": 0.6, "quiet": False}])
    monkeypatch.setattr(run, "wait_quiet", lambda: next(waits))
    args = argparse.Namespace(grid=[(2, 12)], sleeps=[0], fleet=[], tools=["limit"], reps=1, slow_reps=0,
                              budget_s=0, state=tmp_path / "state")
    bench = run.Bench(args)
    try:
        bench.measure((2, 12, 0), "limit")
        bench.measure((2, 12, 0), "limit")
    finally:
        shutil.rmtree(bench.scratch, ignore_errors=True)
    machine = bench.cells[((2, 12, 0), "limit")].machine
    assert [(m["quiet_wait_s"], m["busy_before"]) for m in machine] == [(3.0, 0.05), (30.0, 0.6)]
    printed = capsys.readouterr().out.splitlines()
    assert "waited 3 s for a quiet machine" in printed[-2]
    assert "machine 60% busy before it: waited 30 s, no quieter" in printed[-1]


def test_a_measurement_keeps_its_commands_cpu_and_the_fleet_row_shows_it_a_host_on_each_side() -> None:
    """The CPU of the processes a measurement starts and waits for is this side's (a replay's process,
    the limit's ssh clients); the rest of the machine's busy time is the hosts' side."""
    import subprocess
    import sys

    from bench.run import _cpu_a_host, _timed

    def burn() -> float:  # a child that spins for 0.2 s of CPU: the measured command
        subprocess.run([sys.executable, "-c", "import time\nt = time.process_time() + 0.2\n"
                        "while time.process_time() < t: pass"], check=True)
        return 1.0

    cell = Cell()
    assert _timed(cell, "burn", burn, {}) == 1.0
    (machine,) = cell.machine
    assert 0.2 <= machine["command_cpu_s"] <= machine["busy_s"] + 0.02
    limit, ours = Cell(seconds=[1.0, 1.0]), Cell(seconds=[2.0, 2.0])
    limit.machine = [{"busy_s": 4.0, "command_cpu_s": 3.0}, {"busy_s": 6.0, "command_cpu_s": 2.0}]
    ours.machine = [{"busy_s": 5.0, "command_cpu_s": 1.0}, {"busy_s": 7.0, "command_cpu_s": 1.0}]
    assert _cpu_a_host(limit, 10) == {"controller": 250.0, "hosts": 250.0}
    assert _cpu_a_host(ours, 10) == {"controller": 100.0, "hosts": 500.0}
    assert _cpu_a_host(Cell(seconds=[1.0]), 10) == {"controller": None, "hosts": None}  # not recorded
    fleet = [{"hosts": 10, "tasks": 12, "sleep_ms": 0, "slots": 1,
              "tools": {"limit": limit.summary(), "crosshost": ours.summary()},
              "cpu_ms_a_host": {"limit": _cpu_a_host(limit, 10), "crosshost": _cpu_a_host(ours, 10)},
              "ratios": {"crosshost/limit": 2.0}, "targets": {"within_1.3x_limit_plus_1s": False}}]
    row = next(line for line in render_table({"points": [], "fleet_points": fleet}).splitlines()
               if line.startswith("| 10 |"))
    assert row.endswith("| MISSED | 250 / 100 | 250 / 500 |")
