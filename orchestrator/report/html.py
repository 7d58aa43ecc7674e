"""``report.html``: one self-contained page per run (CSS, JS and SVG inline; nothing fetched).

The page is a static frame rendered here, with every string from the run escaped, plus the run's
data as JSON in a ``<script type="application/json">`` block that a small script renders with
``textContent`` only. Task ids, host names, arguments and observations come from the hosts and the
agent, so nothing of theirs is ever parsed as markup.

What the script renders is ``page_data.py`` (the traces in it ``page_traces.py``), the trend
``trend.py``, what is escaped and how ``markup.py``.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterator, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from orchestrator.analysis.attempts import TraceRecords
from orchestrator.analysis.models import RunReport
from orchestrator.errors import InputError
from orchestrator.exit_policy import undecided_line
from orchestrator.report.markup import embed_json, esc
from orchestrator.report.page_data import build_data
from orchestrator.report.trend import trend_points, trend_svg
from orchestrator.store.rundir import RunDir


def _asset(name: str) -> str:
    return resources.files("orchestrator.report").joinpath("assets", name).read_text(encoding="utf-8")


def _overview(report: RunReport, data: Mapping[str, Any]) -> Iterator[str]:
    yield '<section id="overview"><h2>Overview</h2>'
    state = "valid" if report.valid else "INVALID"
    yield f'<p class="validity {state.lower()}" id="validity"><strong>{state}</strong></p>'
    if report.invalid_reasons:
        yield '<ul class="reasons" id="reasons">'
        yield "".join(f"<li>{esc(r)}</li>" for r in report.invalid_reasons)
        yield "</ul>"
    gate_state = "within" if report.within_gate else "ABOVE"
    yield (
        f'<p class="gate-line {"ok" if report.within_gate else "bad"}" id="gate">flip rate '
        f"<strong>{report.flip_rate:.3f}</strong> ({report.flipped}/{report.comparable} comparable tasks) "
        f"{gate_state} the gate {report.gate:.2f}</p>"
    )
    undecided = undecided_line(report)
    if undecided:
        yield f'<p class="{"bad" if report.inconclusive else "errors"}" id="undecided">{esc(undecided)}</p>'
    if report.error_attempts:
        yield (
            f'<p class="errors">errors: {report.error_attempts} attempt(s) in {report.error_tasks} task(s), '
            "counted apart from flips</p>"
        )
    if report.interrupted:
        yield '<p class="bad">the run was interrupted: results are partial</p>'
    if report.explain:
        yield f'<p class="explain-cost" id="explain-cost">{esc(report.explain)}</p>'
    yield (
        '<table class="hosts" id="hosts"><thead><tr><th>host</th><th>fingerprint</th><th>reachable</th>'
        "<th>pass rate</th><th>pass / fail / error</th><th>pass^k</th><th>leaks</th><th>contract findings</th>"
        "<th>problem</th></tr></thead><tbody>"
    )
    for h in data["hosts"]:
        rate = "—" if h["pass_rate"] is None else f"{h['pass_rate']:.3f}"
        pass_k = ", ".join(f"k={k}: {v:.3f}" for k, v in h["pass_k"].items())
        yield (
            f"<tr><td>{esc(h['name'])}{' <span class=ref>(ref)</span>' if h['reference'] else ''}</td>"
            f"<td><code>{esc(h['fingerprint'] or '—')}</code></td><td>{'yes' if h['reachable'] else 'no'}</td>"
            f"<td>{rate}</td><td>{h['passed']} / {h['failed']} / {h['errors']}</td><td>{esc(pass_k)}</td>"
            f"<td>{h['leaks']}</td><td>{h['findings']}</td><td>{esc(h['error'] or '')}</td></tr>"
        )
    yield "</tbody></table>"
    if report.problems:
        yield '<details class="problems"><summary>problems reading the run</summary><ul>'
        yield "".join(f"<li>{esc(p)}</li>" for p in report.problems[:50])
        yield "</ul></details>"
    yield "</section>"


def render_html(report: RunReport, run_dir: Path, traces: TraceRecords | None = None) -> str:
    """The whole page for ``report`` of ``run_dir`` (``traces``: the records its analysis kept)."""
    data = build_data(report, run_dir, traces)
    try:
        started = RunDir(run_dir).read_manifest().started
    except InputError:
        started = None
    points = trend_points(report, run_dir, started)
    title = f"crosshost run {report.run_id}" + (f" · suite {report.suite}" if report.suite else "")
    meta = [f"reference <strong>{esc(data['run']['reference'] or '—')}</strong>"]
    if report.suite_sha:
        meta.append(f"suite sha <code>{esc(report.suite_sha)}</code>")
    if started:
        meta.append(f"started {esc(started)}")
    meta.append("written " + esc(_dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")))
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        # nothing may be fetched: styles and scripts are inline, images are data or inline SVG
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">",
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title>",
        f"<style>{_asset('report.css')}</style>",
        "</head><body>",
        f'<header><h1>{esc(title)}</h1><p class="meta">{" · ".join(meta)}</p>'
        '<nav><a href="#overview">overview</a> <a href="#matrix-section">flip matrix</a>'
        + (' <a href="#trend">trend</a>' if points else "")
        + ' <a href="report.md">report.md</a> <a href="report.json">report.json</a>'
        ' <a href="junit.xml">junit.xml</a></nav></header><main>',
        *_overview(report, data),
    ]
    if points:
        parts.append(
            f'<section id="trend"><h2>Trend: {len(points)} run(s) of {esc(report.suite or "this suite")}</h2>'
            + trend_svg(points, report.run_id, report.gate, report.host_names())
            + "</section>"
        )
    parts += [
        '<section id="matrix-section"><h2>Flip matrix</h2>',
        '<div class="filters"><label>classification <select id="f-class"><option value="">all</option>'
        '</select></label> <label>host <select id="f-host"><option value="">all</option></select></label> '
        '<label>task <input id="f-search" type="search" placeholder="search task ids"></label> '
        '<label><input id="f-flips" type="checkbox"> flips only</label> <span id="f-count"></span></div>',
        '<p class="legend-line"><span class="v pass">pass</span> <span class="v fail">fail</span> '
        '<span class="v error">error</span> <span class="v fail flipped">fail*</span> = differs from the '
        "reference's verdict on the same attempt. Select a task to compare its traces.</p>",
        '<div class="matrix-wrap"><table id="matrix"><thead></thead><tbody></tbody></table></div>',
        "<noscript><p>The flip matrix and the task view need JavaScript; report.md has the same table.</p>"
        "</noscript></section>",
        '<section id="task" hidden></section>',
        "</main>",
        f'<script type="application/json" id="crosshost-data">{embed_json(data)}</script>',
        f"<script>{_asset('report.js')}</script>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"
