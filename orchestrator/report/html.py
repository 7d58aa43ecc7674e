"""``report.html``: one self-contained page per run (CSS, JS and SVG inline; nothing fetched).

The page is a static frame rendered here, with every string from the run escaped, plus the run's
data as JSON in a ``<script type="application/json">`` block that a small script renders with
``textContent`` only. Task ids, host names, arguments and observations come from the hosts and the
agent, so nothing of theirs is ever parsed as markup.

The traces are shown as the runner wrote them (already redacted), aligned step by step with the
shape diff's own alignment (``shapes.align_steps``).
"""

from __future__ import annotations

import datetime as _dt
import html
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from itertools import islice
from pathlib import Path
from typing import Any, NotRequired, TypedDict
from urllib.parse import quote

from agent_runner.records import TraceFinish, TraceTurn
from agent_runner.trace import CorruptLine, iter_observations, iter_trace
from orchestrator.analysis.attribution import again_line, path_line, trial_line
from orchestrator.analysis.flips import flipped_attempts
from orchestrator.analysis.models import RunReport, TaskReport
from orchestrator.analysis.shapes import Step, align_steps, turn_step
from orchestrator.errors import InputError, TraceError
from orchestrator.exit_policy import undecided_line
from orchestrator.store.rundir import RunDir

MAX_STEPS_PER_TRACE = 300  # steps of one trace embedded (and aligned); the raw file has them all
MAX_EMBEDDED_STEPS = 25_000  # steps embedded in one page; tasks that agree lose their traces first
MAX_TEXT = 2_000  # characters of one argument value or observation shown
MAX_TREND_RUNS = 60

_TASK_FIELDS = (
    "task",
    "verdicts",
    "flip",
    "flipped_hosts",
    "flaky_hosts",
    "classification",
    "action",
    "why",
    "leaks",
    "weak",
    "findings",
    "shape_diff",
    "args_diff",
    "attribution",
    "problems",
    "predicate_output",
    "model_hold",
)


# shown by the page in their own way, or not at all (the statistics only for sampled agents)
_KNOWN = {*_TASK_FIELDS, "comparable", "errors", "evidence", "sampled", "rates", "needed_repeat", "cause", "explain"}


# --- the page's data: what its script reads (assets/report.js) -----------------------------------


class CounterfactualView(TypedDict):
    line: str
    reproduces: bool | None


class PathView(TypedDict):
    line: str
    path: str
    by: list[str]
    state: dict[str, str]


class ExplainView(TypedDict):
    again: str
    counterfactuals: list[CounterfactualView]
    paths: list[PathView]
    not_collected: list[str]


class FinishView(TypedDict):
    verdict: str
    why: str
    predicate_exit: int | None
    reason: str
    final: str


class TraceView(TypedDict):
    path: str
    obs_path: str | None
    steps: list[list[Any]]  # STEP_FIELDS each: a row of mixed values (an argument value is any JSON)
    more: int
    problems: list[str]
    finish: FinishView | None


class PairView(TypedDict):
    """Two traces of the same shapes: ``same`` and ``values``; otherwise the aligned ``rows``."""

    first: int | None
    same: NotRequired[int]
    values: NotRequired[list[int]]
    rows: NotRequired[list[list[Any]]]  # [reference index, other index, op]


class TaskTraces(TypedDict):
    """Per task: per host the trace ids of its attempts, per other host the pairs with the reference."""

    traces: dict[str, list[int | None]]
    pairs: dict[str, list[PairView | None]]
    embedded: bool


class RunView(TypedDict):
    run_id: str
    suite: str | None
    reference: str
    valid: bool
    invalid_reasons: list[str]
    flip_rate: float
    gate: float
    within_gate: bool
    flipped: int
    comparable: int
    explain: str | None


class HostView(TypedDict):
    name: str
    reference: bool
    fingerprint: str | None
    reachable: bool
    error: str | None
    pass_rate: float | None
    passed: int
    failed: int
    errors: int
    pass_k: dict[str, float]
    leaks: int
    findings: int


class PageData(TypedDict):
    run: RunView
    hosts: list[HostView]
    tasks: list[dict[str, Any]]  # a TaskReport's fields as dumped (_TASK_FIELDS), the views beside them
    traces: list[TraceView]


def _explain_view(task: TaskReport, reference: str) -> ExplainView | None:
    """``crosshost explain``'s evidence for the task as the sentences report.md has (one home for them)."""
    entry = task.explain
    if entry is None:
        return None
    return ExplainView(
        again=again_line(entry),
        counterfactuals=[
            CounterfactualView(line=trial_line(cf, reference), reproduces=cf.reproduces) for cf in entry.counterfactuals
        ],
        paths=[PathView(line=path_line(p), path=p.path, by=p.by, state=p.state) for p in entry.paths],
        not_collected=entry.not_collected,
    )


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def _cut(text: str, limit: int = MAX_TEXT) -> str:
    return (
        text
        if len(text) <= limit
        else text[:limit] + f"… ({len(text) - limit} more characters in the raw trace)"
    )


def _shown(value: Any) -> Any:
    """An argument value as embedded: strings cut, containers cut element by element."""
    if isinstance(value, str):
        return _cut(value)
    if isinstance(value, dict):
        return {str(k): _shown(v) for k, v in islice(value.items(), 50)}
    if isinstance(value, list):
        return [_shown(v) for v in value[:50]]
    return value


# --- traces ---------------------------------------------------------------------------------------


@dataclass
class _Trace:
    """One attempt's trace as the page shows it."""

    path: str  # relative to the run directory
    steps: list[list[Any]]  # STEP_FIELDS each
    shape: list[Step]
    finish: TraceFinish | None
    more: int  # 1 when steps were left out (over the trace's budget); the raw file has them
    problems: list[str]
    obs_path: str | None

    def to_json(self) -> TraceView:
        finish = self.finish
        return TraceView(
            path=self.path,
            obs_path=self.obs_path,
            steps=self.steps,
            more=self.more,
            problems=self.problems,
            finish=None
            if finish is None
            else FinishView(
                verdict=finish.verdict, why=_cut(finish.why), predicate_exit=finish.predicate_exit,
                reason=finish.reason, final=_cut(finish.final),
            ),  # fmt: skip
        )


def _observations(path: Path, limit: int) -> dict[int, str]:
    """The sidecar's (already redacted) observations by step, for the first ``limit`` steps."""
    out: dict[int, str] = {}
    if not path.is_file():
        return out
    try:
        for _, record in iter_observations(path):
            if isinstance(record, CorruptLine):
                continue  # a damaged line shows no observation; the raw file is linked
            if record["step"] > limit:
                break
            out[record["step"]] = _cut(record["content"])
    except (TraceError, OSError):
        pass
    return out


def _finish_at_end(path: Path) -> TraceFinish | None:
    """The finish record from the end of a trace not read to the end (the last line, when it is one)."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - 65_536))
            tail = handle.read().decode("utf-8", "replace").strip().splitlines()
        record = json.loads(tail[-1]) if tail else None
    except (OSError, ValueError):
        return None
    # the trace's own record type, from its last line: what iter_trace makes of a finish
    return TraceFinish.from_json(record) if isinstance(record, dict) and record.get("type") == "finish" else None


def _load_trace(path: Path, budget: int) -> _Trace:
    steps: list[list[Any]] = []
    shape: list[Step] = []
    finish: TraceFinish | None = None
    problems: list[str] = []
    more = 0
    obs_file = path.with_name(path.name[: -len(".jsonl")] + ".obs.jsonl")
    try:
        for lineno, record in iter_trace(path):
            if isinstance(record, TraceTurn):
                step = turn_step(record)
                if step is None:
                    continue
                if len(steps) >= budget:
                    more = 1  # at least: the rest of a long trace is not read
                    break
                shape.append(step)
                steps.append(
                    [  # STEP_FIELDS, as a list: a long run embeds tens of thousands of steps
                        step.step,
                        step.tool,
                        _shown(record.args),
                        step.args_fp,
                        record.obs_fp or None,
                        _cut(record.error) if record.error else None,
                        None,
                    ]
                )
            elif isinstance(record, TraceFinish):
                finish = record
            elif isinstance(record, CorruptLine):
                problems.append(f"line {lineno}: {record.error or 'corrupt line'}")
    except (TraceError, OSError) as exc:
        problems.append(str(exc))
    if more:
        finish = _finish_at_end(path)
    obs_exists = obs_file.is_file()
    if steps and obs_exists:
        observed = _observations(obs_file, steps[-1][0])
        for s in steps:
            s[6] = observed.get(s[0])
    host = path.parent.parent.name
    return _Trace(
        path=_link(host, path.name),
        steps=steps,
        shape=shape,
        finish=finish,
        more=more,
        problems=problems[:10],
        obs_path=_link(host, obs_file.name) if obs_exists else None,
    )


def _link(host: str, name: str) -> str:
    """A trace's link relative to report.html, each part percent-encoded (names come from hosts and suites)."""
    return f"hosts/{quote(host, safe='')}/traces/{quote(name, safe='')}"


STEP_FIELDS = ("n", "tool", "args", "args_fp", "obs_fp", "error", "observation")


def _trace_files(run_dir: Path) -> dict[tuple[str, str, int], Path]:
    """``hosts/<host>/traces/<task>.<attempt>.jsonl`` by (host, task, attempt); sidecars skipped."""
    return dict(RunDir(run_dir).trace_files())


def _pair(ref: _Trace, other: _Trace) -> PairView:
    """The aligned rows of two traces and the first row where they part.

    Traces of the same shapes come as ``{"same": n, "values": [rows whose values differ]}``, the
    page's script lays them out row by row. Row ops: ``equal`` (same shape and values), ``values`` (same shape, other argument values),
    and the shape diff's ``changed``/``missing``/``extra``. The first divergence is the first shape
    difference, else the first value difference.
    """
    if [s.shape for s in ref.shape] == [s.shape for s in other.shape]:
        # the same shapes step for step: difflib's answer is one equal block, so skip it
        values = [
            i for i, (a, b) in enumerate(zip(ref.shape, other.shape, strict=True)) if a.args_fp != b.args_fp
        ]
        return PairView(same=len(ref.shape), values=values, first=values[0] if values else None)
    ref_index = {id(s): i for i, s in enumerate(ref.shape)}
    other_index = {id(s): i for i, s in enumerate(other.shape)}
    rows: list[list[Any]] = []
    first_shape = first_values = None
    for edit in align_steps(ref.shape, other.shape):
        op = edit.op
        if (
            op == "equal"
            and edit.reference is not None
            and edit.other is not None
            and edit.reference.args_fp != edit.other.args_fp
        ):
            op = "values"
        if op in ("changed", "missing", "extra") and first_shape is None:
            first_shape = len(rows)
        elif op == "values" and first_values is None:
            first_values = len(rows)
        rows.append(
            [
                ref_index[id(edit.reference)] if edit.reference is not None else None,
                other_index[id(edit.other)] if edit.other is not None else None,
                op,
            ]
        )
    first = first_shape if first_shape is not None else first_values
    return PairView(rows=rows, first=first)


def _task_order(report: RunReport) -> list[TaskReport]:
    """Tasks by how much their traces matter: flips, then any finding, then the rest."""

    def weight(t: TaskReport) -> int:
        if t.flip:
            return 0
        if t.classification != "agree" or t.leaks or t.weak or t.shape_diff or t.args_diff:
            return 1
        return 2

    return sorted(report.tasks, key=weight)


# --- the data the script renders ------------------------------------------------------------------


def build_data(report: RunReport, run_dir: Path) -> PageData:
    """Everything the page's script shows, as plain JSON-able data."""
    hosts = report.host_names()
    reference = report.reference or (hosts[0] if hosts else "")
    files = _trace_files(run_dir)
    traces: list[TraceView] = []
    per_task: dict[str, TaskTraces] = {}
    budget = MAX_EMBEDDED_STEPS
    for task in _task_order(report):
        entry = TaskTraces(traces={}, pairs={}, embedded=True)
        loaded: dict[tuple[str, int], _Trace] = {}
        n_attempts = max((len(v) for v in task.verdicts.values()), default=0)
        for host in hosts:
            ids: list[int | None] = []
            for attempt in range(n_attempts):
                path = files.get((host, task.task, attempt))
                if path is None:
                    ids.append(None)
                    continue
                if budget <= 0:
                    entry["embedded"] = False
                    ids.append(None)
                    continue
                trace = _load_trace(path, min(MAX_STEPS_PER_TRACE, budget))
                budget -= max(1, len(trace.steps))
                loaded[(host, attempt)] = trace
                ids.append(len(traces))
                traces.append(trace.to_json())
            entry["traces"][host] = ids
        for host in hosts:
            if host == reference:
                continue
            entry["pairs"][host] = [
                _pair(loaded[(reference, a)], loaded[(host, a)])
                if (reference, a) in loaded and (host, a) in loaded
                else None
                for a in range(n_attempts)
            ]
        per_task[task.task] = entry

    stats = {s.host: s for s in report.stats}
    host_rows = []
    for name in hosts:
        entry_h = next((h for h in report.hosts if h.name == name), None)
        s = stats.get(name)
        host_rows.append(
            HostView(
                name=name,
                reference=name == reference,
                fingerprint=entry_h.fingerprint if entry_h else None,
                reachable=entry_h.reachable if entry_h else True,
                error=entry_h.error if entry_h else None,
                pass_rate=s.pass_rate if s else None,
                passed=s.passed if s else 0,
                failed=s.failed if s else 0,
                errors=s.errors if s else 0,
                pass_k=s.pass_k if s else {},
                leaks=sum(1 for t in report.tasks for leak in t.leaks if leak.host == name),
                findings=sum(1 for t in report.tasks for f in t.findings if f.host == name),
            )
        )

    tasks = []
    for task in report.tasks:
        dumped = task.model_dump(mode="json")
        row = {k: dumped.get(k) for k in _TASK_FIELDS}
        # fields the analysis adds later (evidence, explanations) are shown as they come
        if task.sampled or task.evidence != "deterministic":
            row["statistics"] = {
                "evidence": task.evidence,
                "needed_repeat": task.needed_repeat,
                "rates": dumped["rates"],
            }
        row["extra"] = {k: v for k, v in dumped.items() if k not in _KNOWN and v}
        row["cause"] = task.cause if task.flip else ""
        row["explain"] = _explain_view(task, reference)
        row["flipped_attempts"] = {h: sorted(flipped_attempts(task, h, reference)) for h in hosts}
        row.update(per_task.get(task.task, {}))
        tasks.append(row)

    return PageData(
        run=RunView(
            run_id=report.run_id,
            suite=report.suite,
            reference=reference,
            valid=report.valid,
            invalid_reasons=report.invalid_reasons,
            flip_rate=report.flip_rate,
            gate=report.gate,
            within_gate=report.within_gate,
            flipped=report.flipped,
            comparable=report.comparable,
            explain=report.explain,
        ),
        hosts=host_rows,
        tasks=tasks,
        traces=traces,
    )


def embed_json(data: Any) -> str:
    """JSON safe inside a ``<script>`` element: no ``<``, ``>`` or ``&`` survives as itself."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


# --- the trend ------------------------------------------------------------------------------------


@dataclass
class TrendPoint:
    run_id: str
    started: str | None
    flip_rate: float | None
    pass_rate: Mapping[str, float | None]


def trend_points(report: RunReport, run_dir: Path, started: str | None) -> list[TrendPoint]:
    """This suite's runs from the history index beside the run (when there is one), this run included.

    The index is only read: a run directory copied elsewhere gets no trend rather than a new index.
    """
    from orchestrator.errors import CrosshostError
    from orchestrator.store.history import history, index_path

    runs_dir = run_dir.parent
    if not index_path(runs_dir).is_file():
        return []
    try:
        rows = history(runs_dir, report.suite, kind="replay")
    except CrosshostError:
        return []
    points = [TrendPoint(r.run_id, r.started or r.finished, r.flip_rate, r.pass_rate) for r in rows]
    if not points:
        return []
    this = TrendPoint(
        report.run_id, started, report.flip_rate, {s.host: s.pass_rate for s in report.stats}
    )  # the report being written wins over what the index holds for it (a new --gate, say)
    points = [p for p in points if p.run_id != report.run_id] + [this]
    points.sort(key=lambda p: (p.started or "", p.run_id))
    return points[-MAX_TREND_RUNS:]


DOT_R = 3.5  # a trend point's radius
_PALETTE = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f")


def trend_svg(points: Sequence[TrendPoint], current: str, gate: float, order: Sequence[str] = ()) -> str:
    """Flip rate and each host's pass rate over the runs, as inline SVG (escaped), with a legend;
    hosts in ``order`` (this run's columns) first."""
    width, height, left, right, top, bottom = 760, 240, 44, 16, 12, 28
    plot_w, plot_h = width - left - right, height - top - bottom
    n = len(points)

    def x(i: int) -> float:
        return left + (plot_w * i / (n - 1) if n > 1 else plot_w / 2)

    def y(v: float) -> float:
        return top + plot_h * (1 - max(0.0, min(1.0, v)))

    hosts = [h for h in order if any(h in p.pass_rate for p in points)]
    for p in points:
        hosts += [h for h in p.pass_rate if h not in hosts]
    series: list[tuple[str, str, list[float | None], str]] = [
        ("flip rate", "#d62728", [p.flip_rate for p in points], "6 3")
    ]
    for i, host in enumerate(hosts):
        series.append(
            (f"{host} pass rate", _PALETTE[i % len(_PALETTE)], [p.pass_rate.get(host) for p in points], "")
        )

    out = [
        f'<svg class="trend" role="img" aria-label="flip rate and pass rate per host over {n} run(s)" '
        f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">'
    ]
    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        out.append(
            f'<line x1="{left}" x2="{width - right}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" class="grid"/>'
            f'<text x="{left - 6}" y="{y(tick) + 4:.1f}" text-anchor="end" class="axis">{tick:.0%}</text>'
        )
    out.append(
        f'<line x1="{left}" x2="{width - right}" y1="{y(gate):.1f}" y2="{y(gate):.1f}" class="gate">'
        f"<title>gate {gate:.2f}</title></line>"
    )
    for i, p in enumerate(points):
        if p.run_id == current:
            out.append(
                f'<line x1="{x(i):.1f}" x2="{x(i):.1f}" y1="{top}" y2="{top + plot_h}" class="current">'
                f"<title>this run: {esc(p.run_id)}</title></line>"
            )
    # dots of one run at the same height are set side by side, a dot's width apart, so none hides
    # another (one run, or hosts with the same pass rate); the lines still join the run's own x
    shift: dict[tuple[int, int], float] = {}
    for i in range(n):
        heights = sorted((y(at), k) for k, at in enumerate(s[2][i] for s in series) if at is not None)
        groups: list[list[int]] = []
        above: float | None = None
        for h, k in heights:  # dots closer than a dot's width overlap: one group
            if above is None or h - above >= 2 * DOT_R:
                groups.append([])
            groups[-1].append(k)
            above = h
        for same in groups:
            for j, k in enumerate(same):
                shift[(k, i)] = (j - (len(same) - 1) / 2) * 2 * DOT_R * 1.15
    for k, (label, colour, values, dash) in enumerate(series):
        coords = [(x(i), y(v)) for i, v in enumerate(values) if v is not None]
        if len(coords) > 1:
            dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
            pts = " ".join(f"{a:.1f},{b:.1f}" for a, b in coords)
            out.append(
                f'<polyline fill="none" stroke="{colour}" stroke-width="2"{dash_attr} points="{pts}"/>'
            )
        for i, v in enumerate(values):
            if v is not None:
                out.append(
                    f'<circle cx="{x(i) + shift.get((k, i), 0.0):.1f}" cy="{y(v):.1f}" r="{DOT_R}" fill="{colour}">'
                    f"<title>{esc(points[i].run_id)} · {esc(label)}: {v:.1%}</title></circle>"
                )
    first, last = points[0], points[-1]
    out.append(
        f'<text x="{left}" y="{height - 8}" class="axis">{esc((first.started or first.run_id)[:16])}</text>'
        f'<text x="{width - right}" y="{height - 8}" text-anchor="end" class="axis">'
        f"{esc((last.started or last.run_id)[:16])}</text>"
    )
    out.append("</svg>")
    legend = "".join(
        f'<li><span class="swatch" style="background:{colour}"></span>{esc(label)}</li>'
        for label, colour, _, _ in series
    )
    return (
        "".join(out)
        + f'<ul class="legend">{legend}<li><span class="swatch gate-swatch"></span>gate</li></ul>'
    )


# --- the page -------------------------------------------------------------------------------------


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


def render_html(report: RunReport, run_dir: Path) -> str:
    """The whole page for ``report`` of ``run_dir``."""
    data = build_data(report, run_dir)
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
