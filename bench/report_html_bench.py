"""report.html benchmark: a run of 2,000 tasks x 4 hosts, written and opened in a real headless Chromium.

Measures writing the page (``render_html`` after ``analyse_run``), its size, and in the browser:
the time from navigation until the flip matrix is built and the page answers (``crosshostReadyMs``,
``performance.now()`` when the script has finished), opening a flipped task's side-by-side view, and
applying a filter. The target: interactive in under 2 s.

Usage: ``python -m bench.report_html_bench [--tasks 2000] [--hosts 4] [--attempts 2] [--reps 3]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.analysis_bench import RunShape, make_run_dir

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tools/ is a plain directory, not an installed package
from tools.headless import Browser  # noqa: E402

TARGET_S = 2.0
LINES_PER_TRACE = 8  # header, 6 tool calls, finish

_OPEN_TASK = """(async () => {
  const t0 = performance.now();
  const done = new Promise(r => window.addEventListener('hashchange', r, {once: true}));
  location.hash = 'task=' + encodeURIComponent(%s);
  await done;
  await new Promise(r => requestAnimationFrame(() => setTimeout(r, 0)));
  const ok = !document.getElementById('task').hidden && document.querySelectorAll('#task table.sbs').length > 0;
  return [performance.now() - t0, ok];
})()"""

_FILTER = """(async () => {
  const t0 = performance.now();
  const e = document.getElementById('f-class');
  e.value = 'host_coupling';
  e.dispatchEvent(new Event('change'));
  await new Promise(r => requestAnimationFrame(() => setTimeout(r, 0)));
  const shown = [...document.querySelectorAll('#matrix tbody tr')].filter(tr => !tr.hidden).length;
  return [performance.now() - t0, shown];
})()"""


def measure(tasks: int = 2000, hosts: int = 4, attempts: int = 2, reps: int = 3) -> dict[str, Any]:
    from orchestrator.analysis import analyse_run
    from orchestrator.report.html import render_html

    scratch = Path(tempfile.mkdtemp(prefix="crosshost-bench-html-"))
    try:
        shape = RunShape(hosts=hosts, tasks=tasks, attempts=attempts)
        run_dir = make_run_dir(scratch, shape.traces * LINES_PER_TRACE, shape)
        t0 = time.perf_counter()
        report = analyse_run(run_dir)
        analyse_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        page = render_html(report, run_dir)
        render_s = time.perf_counter() - t0
        (run_dir / "report.html").write_text(page, encoding="utf-8")
        flipped = next(t.task for t in report.tasks if t.flip)
        url = (run_dir / "report.html").as_uri()
        ready, wall, open_task, filtering = [], [], [], []
        errors: list[str] = []
        with Browser(timeout=60) as browser:
            for _ in range(reps):
                tab = browser.page()
                t0 = time.perf_counter()
                tab.send("Page.navigate", {"url": url})
                tab.wait_for("document.body && document.body.dataset.ready === '1'", timeout=60)
                wall.append(time.perf_counter() - t0)
                ready.append(tab.evaluate("window.crosshostReadyMs") / 1000)
                ms, ok = tab.evaluate(_OPEN_TASK % json.dumps(flipped))
                if not ok:
                    errors.append("the task view did not show a side-by-side table")
                open_task.append(ms / 1000)
                ms, shown = tab.evaluate(_FILTER)
                filtering.append(ms / 1000)
                errors += tab.console_errors()
                tab.send("Page.close")
        out = {
            "tasks": tasks, "hosts": hosts, "attempts": attempts, "cells": tasks * hosts * attempts,
            "page_mb": round(len(page.encode()) / 1e6, 2),
            "analyse_s": round(analyse_s, 3), "render_s": round(render_s, 3),
            "ready_s": [round(x, 3) for x in ready], "ready_median_s": round(statistics.median(ready), 3),
            "wall_to_ready_median_s": round(statistics.median(wall), 3),
            "open_task_median_s": round(statistics.median(open_task), 3),
            "filter_median_s": round(statistics.median(filtering), 3), "filter_rows_shown": shown,
            "console_errors": errors[:5], "target_s": TARGET_S,
        }  # fmt: skip
        out["within_target"] = out["wall_to_ready_median_s"] < TARGET_S and not errors
        return out
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=2000)
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--attempts", type=int, default=2)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args(argv)
    out = measure(args.tasks, args.hosts, args.attempts, args.reps)
    print(json.dumps(out, indent=2))
    return 0 if out["within_target"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
