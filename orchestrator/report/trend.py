"""The trend of ``report.html``: this suite's runs from the history index, drawn as inline SVG."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.analysis.models import RunReport
from orchestrator.report.markup import esc

MAX_TREND_RUNS = 60


@dataclass
class TrendPoint:
    run_id: str
    started: str | None
    flip_rate: float | None
    pass_rate: Mapping[str, float | None]


def trend_points(report: RunReport, run_dir: Path, started: str | None) -> list[TrendPoint]:
    """This suite's runs from the history index beside the run (when there is one), this run included.

    The index is only read: a run directory copied elsewhere gets no trend rather than a new index.
    Only the newest runs are read, one more than are drawn: this run may be among them, and what it
    says now wins over what the index holds for it.
    """
    from orchestrator.errors import CrosshostError
    from orchestrator.store.history import index_path, newest_rates

    runs_dir = run_dir.parent
    if not index_path(runs_dir).is_file():
        return []
    try:
        rows = newest_rates(runs_dir, report.suite, "replay", MAX_TREND_RUNS + 1)
    except CrosshostError:
        return []
    if not rows:
        return []
    this = TrendPoint(
        report.run_id, started, report.flip_rate, {s.host: s.pass_rate for s in report.stats}
    )  # the report being written wins over what the index holds for it (a new --gate, say)
    points = [TrendPoint(r.run_id, r.started or r.finished, r.flip_rate, r.pass_rate) for r in rows]
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
