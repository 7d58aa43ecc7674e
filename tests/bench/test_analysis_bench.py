from pathlib import Path

from bench.analysis_bench import RunShape, count_trace_lines, make_run_dir, measure
from orchestrator.analysis.run import analyse_run


def test_run_dir_has_exactly_the_requested_lines_and_analyses(tmp_path: Path) -> None:
    run_dir = make_run_dir(tmp_path, 4003, RunShape(hosts=3, tasks=5, attempts=2))
    assert count_trace_lines(run_dir) == 4003
    report = analyse_run(run_dir)
    assert report.valid, report.invalid_reasons
    by_task = {t.task: t for t in report.tasks}
    assert len(by_task) == 5
    assert by_task["task-003"].flip  # fails on the last host only
    assert not by_task["task-000"].flip
    assert by_task["task-001"].shape_diff  # another tool on the last host


def test_measure_reports_both_sides(tmp_path: Path) -> None:
    run_dir = make_run_dir(tmp_path, 2000, RunShape(hosts=2, tasks=2, attempts=1))
    out = measure(run_dir)
    assert out["lines"] == 2000
    assert out["analyse_median_s"] > 0 and out["json_limit_median_s"] > 0
    assert 10 < out["analyse_peak_rss_mb"] < 1000
