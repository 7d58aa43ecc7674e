"""The reports of a run: ``report.json``, ``report.md``, ``junit.xml`` and ``report.html`` (the
terminal table is ``orchestrator.ui.report_table``).

Every renderer reads the ``RunReport`` (the HTML page also reads the run's traces and history);
``write_reports`` writes the four files atomically.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from xml.etree import ElementTree as ET

from agent_runner.textguard import printable
from orchestrator.analysis import analyse_run
from orchestrator.analysis.attempts import TraceRecords
from orchestrator.analysis.attribution import again_line, path_line, shown, trial_line
from orchestrator.analysis.compare import AgentRate, Comparison
from orchestrator.analysis.models import REPORT_NAME, HostRate, Leak, RunReport, TaskReport
from orchestrator.exit_policy import undecided_line
from orchestrator.report.html import render_html
from orchestrator.selection import TaskSelection
from orchestrator.store.rundir import write_bytes_atomic

__all__ = [
    "burn_lines",
    "render_compare_json",
    "render_compare_markdown",
    "errors_line",
    "gate_verdict",
    "outside_workspace_lines",
    "render_json",
    "render_junit",
    "p_text",
    "rate_text",
    "rates_legend",
    "render_markdown",
    "validity_line",
    "analyse_and_write",
    "write_reports",
    "FORMATS",
]


def gate_verdict(report: RunReport) -> str:
    if report.comparable == 0:
        return f"no comparable task: nothing was measured, the gate ({report.gate:.2f}) is not passed"
    state = "within" if report.within_gate else "ABOVE"
    return (
        f"flip_rate={report.flip_rate:.3f} ({report.flipped}/{report.comparable} comparable tasks) "
        f"{state} gate={report.gate:.2f}"
    )


def burn_lines(report: RunReport) -> list[str]:
    """Every host's ``burn`` isolation finding, one a line (listed whether or not they invalidate),
    then one line saying what they do to this run."""
    if not report.burn:
        return []
    effect = (
        "these burn findings invalidate the run ([gate] burn_invalidates = true)"
        if report.burn_invalidates
        else "burn findings are listed; with [gate] burn_invalidates = true they invalidate the run"
    )
    return [*(f"burn: {f.host}: {f.kind} ({f.detail}): {f.meaning}" for f in report.burn), effect]


def outside_workspace_lines(report: RunReport) -> list[str]:
    """One warning line per attempt that left files outside its workspace on its host."""
    lines = []
    for f in report.outside_workspace:
        more = f" and {f.count - len(f.paths)} more" if f.count > len(f.paths) else ""
        lines.append(
            f"warning: {f.host}: {f.task}.{f.attempt} left {f.count} file(s) outside its workspace, kept on "
            f"the host (not a verdict): {', '.join(f.paths)}{more}"
        )
    return lines


def weak_line(report: RunReport) -> str | None:
    """How many weak findings the run has and the first: they are no leaks, but a user should see them."""
    weak = [(t.task, w) for t in report.tasks for w in t.weak]
    if not weak:
        return None
    task, first = weak[0]
    return (
        f"weak: {len(weak)} finding(s) of a generic host name without cross-host evidence, not leaks (first: "
        f"{task}.{first.attempt} on {first.host} step {first.step}: {first.message})"
    )


def validity_line(report: RunReport) -> str:
    """``valid``, or ``INVALID`` and one indented reason a line."""
    if report.valid:
        return "valid"
    return "\n".join(["INVALID", *(f"  - {reason}" for reason in report.invalid_reasons)])


def _percent(x: float) -> str:
    return f"{100 * x:.0f}"


def rate_text(rate: HostRate, *, with_p: bool) -> str:
    """``4/8 50% [22-78]`` (passes/non-error attempts, pass rate, 95% Wilson interval), then
    `` p=0.032`` (Fisher's exact test against the reference) when ``with_p`` and the host is not it."""
    if rate.n == 0:
        return "0/0"
    text = f"{rate.passes}/{rate.n} {_percent(rate.passes / rate.n)}% [{_percent(rate.ci_low)}-{_percent(rate.ci_high)}]"
    if with_p and rate.p_value is not None:
        text += f" p={p_text(rate.p_value)}"
        if rate.p_adjusted is not None and rate.p_adjusted != rate.p_value:
            text += f" adj={p_text(rate.p_adjusted)}"
    return text


def p_text(p: float) -> str:
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def errors_line(report: RunReport) -> str:
    return f"errors: {report.error_attempts} attempt(s) in {report.error_tasks} task(s), counted apart from flips"


#: how each correction is named in a sentence
CORRECTION_NAMES = {"bh": "Benjamini–Hochberg, false discovery rate", "holm": "Holm, family-wise error rate"}


def rates_legend(report: RunReport) -> str:
    looks = f", over {report.looks} looks: alpha/{report.looks} each" if report.looks > 1 else ""
    return (
        "P/F/E = pass/fail/error; n/N rate [95% Wilson interval]; p = Fisher's exact test against the reference, shown where "
        f"attempts vary or the agent is sampled; adj = p adjusted across the suite ({CORRECTION_NAMES.get(report.correction, report.correction)}, "
        f"{report.family} comparison(s){looks}); a host differs at adj < alpha={report.alpha:g}"
    )


# --- report.json ----------------------------------------------------------------------------------


def render_json(report: RunReport) -> str:
    return report.to_json_text()


# --- report.md ------------------------------------------------------------------------------------


# What Markdown reads as markup anywhere in a line (emphasis, code, links, HTML, entities, tables,
# strikethrough); an underscore only where it can open or close emphasis (not inside a word)
_MD_MARKUP = re.compile(r"[\\`*\[\]<>&|~]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
# What it reads as markup at the start of a list item's text: a heading, a quote, a nested list
_MD_LEADING = re.compile(r"^(\s*)([#>+=-])|^(\s*\d+)([.)])")


def _md(text: object) -> str:
    """Untrusted text (a name, a host's output) in report.md: control characters shown, and every
    Markdown construct escaped, so a reader sees the text as it is, never rendered."""
    escaped = _MD_MARKUP.sub(lambda m: "\\" + m.group(), printable(text).replace("\n", " "))
    return _MD_LEADING.sub(lambda m: m.expand(r"\1\\\2" if m.group(2) else r"\3\\\4"), escaped)


def _code(text: object) -> str:
    """Untrusted text as an inline code span: fenced by more backticks than it holds in a row, so
    it cannot end the span early; nothing inside a code span is read as markup."""
    shown = printable(text).replace("\n", " ")
    fence = "`" * (max((len(run) for run in re.findall("`+", shown)), default=0) + 1)
    pad = " " if shown.startswith("`") or shown.endswith("`") else ""
    return f"{fence}{pad}{shown}{pad}{fence}"


def render_markdown(report: RunReport) -> str:
    hosts = report.host_names()
    out = [f"# crosshost run `{report.run_id}`", ""]
    if report.suite:
        out.append(
            f"- suite: **{_md(report.suite)}**" + (f" (`{report.suite_sha}`)" if report.suite_sha else "")
        )
    out.append(f"- reference host: **{_md(report.reference)}**")
    out.append(f"- validity: **{'valid' if report.valid else 'INVALID'}**")
    out += [f"  - {_md(reason)}" for reason in report.invalid_reasons]
    out += [f"- {_md(line)}" for line in burn_lines(report)]
    out += [f"- {_md(line)}" for line in outside_workspace_lines(report)]
    weak_summary = weak_line(report)
    if weak_summary:
        out.append(f"- {_md(weak_summary)}")
    out += [f"- note: {_md(note)}" for note in report.notes]
    if report.explain:
        out.append(f"- {_md(report.explain)}")
    out.append(f"- gate: {_md(gate_verdict(report))}")
    undecided = undecided_line(report)
    if undecided:
        out.append(f"- {_md(undecided)}")
    if report.error_attempts:
        out.append(f"- {errors_line(report)}")
    out += [
        "",
        "## Hosts",
        "",
        "| host | fingerprint | reachable | error | pass rate | pass^k |",
        "|---|---|---|---|---|---|",
    ]
    stats = {s.host: s for s in report.stats}
    for h in report.hosts:
        s = stats.get(h.name)
        rate = f"{s.pass_rate:.3f}" if s and s.pass_rate is not None else "—"
        pass_k = ", ".join(f"k={k}: {v:.3f}" for k, v in s.pass_k.items()) if s else ""
        out.append(
            f"| {_md(h.name)} | `{h.fingerprint or '—'}` | {'yes' if h.reachable else 'no'} | "
            f"{_md(h.error or '')} | {rate} | {pass_k} |"
        )
    out += ["", "## Tasks", ""]
    out.append("| task | " + " | ".join(_md(h) for h in hosts) + " | flip | classification | action |")
    out.append("|---" * (len(hosts) + 4) + "|")
    for task in report.tasks:
        cells = [" ".join(task.verdicts.get(h, [])) for h in hosts]
        out.append(
            f"| {_md(task.task)} | "
            + " | ".join(cells)
            + f" | {'**flip**' if task.flip else ''} | {task.classification} | {_md(task.action)} |"
        )
    out += _markdown_rates(report, hosts)
    held = [t for t in report.tasks if t.model_hold]
    if held:
        out += ["", f"## Held model ({report.hold_model})", ""]
        out += [f"- {_md(t.task)}: {_md(line)}" for t in held for line in t.model_hold]
    details = [
        t for t in report.tasks if t.classification != "agree" or t.leaks or t.weak or t.shape_diff or t.args_diff
    ]
    if details:
        out += ["", "## Details"]
    for task in details:
        out += ["", f"### {_md(task.task)}: {task.classification} — {_md(task.action)}", ""]
        for host, whys in task.why.items():
            said = task.predicate_output.get(host, [])
            for attempt, why in enumerate(whys):
                verdict = task.verdicts[host][attempt]
                if why and verdict != "pass":
                    out.append(f"- {_md(host)} attempt {attempt} ({verdict}): {_md(why)}")
                last = _last_line(said[attempt] if attempt < len(said) else None)
                if last and verdict == "pass":  # a fail's why already ends with it
                    out.append(f"- {_md(host)} attempt {attempt} (pass): predicate said: {_md(last)}")
        for d in task.shape_diff:
            out.append(
                f"- shape {d.op} on {_md(d.host)} attempt {d.attempt}: "
                f"{_code(d.reference or '∅')} (ref step {d.reference_step}) → {_code(d.other or '∅')} (step {d.step})"
            )
        for a in task.args_diff:
            out.append(
                f"- argument values differ on {_md(a.host)} attempt {a.attempt} step {a.step} {_code(a.tool)}: "
                f"args_fp `{a.reference_args_fp}` → `{a.args_fp}`"
            )
            out += [f"  - {_code(v.key)}: {_md(_quoted(v.reference))} → {_md(_quoted(v.other))}" for v in a.values]
        for leak in task.leaks:
            out.append(
                f"- leak on {_md(leak.host)} attempt {leak.attempt} step {leak.step}: {leak_line(leak, _md)}"
            )
        for weak in task.weak:
            out.append(
                f"- weak finding (not a leak) on {_md(weak.host)} attempt {weak.attempt} step {weak.step}: "
                f"{leak_line(weak, _md)}"
            )
        for f in task.findings:
            out.append(
                f"- contract: {_md(f.host)} attempt {f.attempt} step {f.step}: {f.kind}: {_md(f.message)}"
            )
        if task.cause:
            out.append(f"- cause: {_md(task.cause)}")
        if task.explain is not None:
            out += _markdown_explain(task, report.reference or "")
        for attr in task.attribution:
            # every differing fact, whole, most relevant first (docs/explain.md)
            out.append(
                f"- attribution {_md(attr.reference)} vs {_md(attr.host)}:"
                + ("" if attr.fields else " no differing field")
            )
            out += [
                f"  - {_code(f.field)}: {_md(shown(f.reference))} → {_md(shown(f.other))}"
                + (f" ({_md(f.tied)})" if f.tied else "")
                for f in attr.fields
            ]
        out += [f"- problem: {_md(p)}" for p in task.problems]
    return printable("\n".join(out)) + "\n"  # fields not passed through _md too


def _markdown_explain(task: TaskReport, reference: str) -> list[str]:
    """``crosshost explain``'s evidence for one task, whole (docs/explain.md)."""
    entry = task.explain
    assert entry is not None
    out = [f"- explain, {_md(again_line(entry))}"] if entry.again else []
    out += [f"- explain, {_md(trial_line(cf, reference))}" for cf in entry.counterfactuals]
    out += [f"- explain, file evidence: {_md(path_line(p))}" for p in entry.paths]
    out += [f"- explain: {_md(line)}" for line in entry.not_collected]
    return out


def leak_line(leak: Leak, text: Callable[[str], str] = str) -> str:
    """``kind [rule]: message (evidence)``: which rule fired and on what; ``text`` escapes host text."""
    rule = f" [{leak.rule}]" if leak.rule else ""
    evidence = f" ({text(leak.evidence)})" if leak.evidence else ""
    return f"{leak.kind}{rule}: {text(leak.message)}{evidence}"


def _quoted(value: str | None) -> str:
    return "(not passed)" if value is None else json.dumps(value, ensure_ascii=False)


def _markdown_rates(report: RunReport, hosts: list[str]) -> list[str]:
    """Per task and host: n, passes, pass rate, 95% Wilson interval and the p-value against the reference."""
    out = [
        "",
        "## Pass rates",
        "",
        f"Non-error attempts per task and host, the pass rate with its 95% Wilson interval, and the "
        f"two-sided p-value of Fisher's exact test against the reference ({_md(report.reference)}), "
        f"then (adj) that p-value adjusted across the suite ({CORRECTION_NAMES.get(report.correction, _md(report.correction))}, "
        f"{report.family} comparison(s)); a host differs at adj < {report.alpha / report.looks:g} where attempts vary "
        "within a host or the agent is sampled, and on the same attempt's verdict otherwise (deterministic evidence).",
        "",
        "| task | evidence | " + " | ".join(_md(h) for h in hosts) + " |",
        "|---" * (len(hosts) + 2) + "|",
    ]
    for task in report.tasks:
        rates = {r.host: r for r in task.rates}
        cells = []
        for host in hosts:
            rate = rates.get(host)
            text = rate_text(rate, with_p=True) if rate else "—"
            cells.append(f"**{text}**" if rate and rate.differs else text)
        out.append(f"| {_md(task.task)} | {task.evidence} | " + " | ".join(cells) + " |")
    return out


def _last_line(output: str | None) -> str:
    lines = (output or "").strip().splitlines()
    return lines[-1][:200] if lines else ""


# --- junit.xml ------------------------------------------------------------------------------------


def _failure_text(task: TaskReport, report: RunReport) -> str:
    lines = [f"{task.classification}: {task.action}"]
    for host, verdicts in task.verdicts.items():
        lines.append(f"{host}{' (ref)' if host == report.reference else ''}: {' '.join(verdicts)}")
        lines += [f"  attempt {i}: {why}" for i, why in enumerate(task.why.get(host, [])) if why]
    lines += [f"leak: {leak.host} step {leak.step}: {leak_line(leak)}" for leak in task.leaks]
    return "\n".join(lines)


#: the test case an invalid run fails in junit.xml (a task id cannot hold a space)
RUN_CASE = "run validity"


def render_junit(report: RunReport) -> str:
    """One test case per task (a flip a failure, an ``error`` verdict an error), and for an invalid
    run one more case, ``run validity``, that fails with the reasons."""
    suite_name = report.suite or "crosshost"
    failures = errors = 0
    suite = ET.Element("testsuite", name=f"crosshost.{suite_name}")
    props = ET.SubElement(suite, "properties")
    for name, value in (
        ("run_id", report.run_id),
        ("reference", report.reference or ""),
        ("valid", str(report.valid).lower()),
        ("flip_rate", f"{report.flip_rate:.3f}"),
        ("gate", f"{report.gate:.2f}"),
    ):
        ET.SubElement(props, "property", name=name, value=value)
    invalid = "invalid run: " + "; ".join(report.invalid_reasons) if not report.valid else ""
    cases: list[tuple[str, TaskReport | None]] = [(t.task, t) for t in report.tasks]
    if invalid:  # the run's validity is a case of its own: a task that agreed did not fail
        cases.append((RUN_CASE, None))
    for name, task in cases:
        case = ET.SubElement(suite, "testcase", classname=suite_name, name=name)
        if task is None:
            failures += 1
            failure = ET.SubElement(case, "failure", message=invalid, type="crosshost.invalid")
            failure.text = "\n".join(report.invalid_reasons)
        elif task.flip:
            failures += 1
            failure = ET.SubElement(
                case,
                "failure",
                message=f"flip on {', '.join(task.flipped_hosts)} vs {report.reference}: {task.classification}",
                type="crosshost.flip",
            )
            failure.text = _failure_text(task, report)
        elif task.classification == "infra_error":
            errors += 1
            error = ET.SubElement(
                case, "error", message=f"infra_error: {task.action}", type="crosshost.infra_error"
            )
            error.text = _failure_text(task, report)
        elif task.classification != "agree":
            ET.SubElement(case, "system-out").text = _failure_text(task, report)
    suite.set("tests", str(len(cases)))
    suite.set("failures", str(failures))
    suite.set("errors", str(errors))
    root = ET.Element("testsuites")
    root.append(suite)
    ET.indent(root)
    # control characters are not XML: shown as text (ElementTree writes them raw), ANSI colour dropped
    return '<?xml version="1.0" encoding="utf-8"?>\n' + printable(ET.tostring(root, encoding="unicode")) + "\n"


# --- crosshost compare ---------------------------------------------------------------------------


def _agent_rate_text(rate: AgentRate) -> str:
    if rate.n == 0:
        return "0/0"
    return (
        f"{rate.passes}/{rate.n} {_percent(rate.passes / rate.n)}% "
        f"[{_percent(rate.ci_low)}-{_percent(rate.ci_high)}]"
    )


def gap_text(c: Comparison) -> str:
    """"mean gap B − A: -0.850 [95% CI -0.95, -0.75] over 4 tasks (paired; clustered by tag: 2 tags)"."""
    if c.gap_mean is None:
        return "mean gap B − A: none (no task has attempts in both runs)"
    unit = f"clustered by tag: {c.clusters} tag(s)" if c.clustered_by_tag else f"{c.clusters} task(s)"
    interval = f" [95% CI {c.gap_ci_low:+.3f}, {c.gap_ci_high:+.3f}]" if c.gap_ci_low is not None else ""
    text = f"mean gap B − A on the reference: {c.gap_mean:+.3f}{interval} (paired over tasks; {unit})"
    return text + (f"; undecided: {c.resolve}" if c.resolve else "")


def render_compare_markdown(c: Comparison) -> str:
    """The model gap beside the box, for people: the reading first, then one row per task."""
    out = [
        f"# crosshost compare `{c.run_a}` (A) vs `{c.run_b}` (B)",
        "",
        f"- suite: **{_md(c.suite)}**, hosts: {_md(', '.join(c.hosts))}, reference: **{_md(c.reference)}**",
        f"- model gap: the agents differ on **{c.model_gap}** of {len(c.tasks)} task(s) on {_md(c.reference)} "
        f"(adjusted p < {c.alpha:g} where attempts vary or an agent is sampled)",
        f"- box: **{c.box_flips}** task(s) with a host difference in either run",
        f"- {_md(gap_text(c))}",
        f"- reading: **{c.reading}**",
        f"- exit {c.exit_code}: "
        + ("the model gap exceeds the box's flips" if c.exit_code == 0 else "the model gap does not exceed the box's flips"),
        "",
        f"| task | A on {_md(c.reference)} | B on {_md(c.reference)} | p | model gap | box A | box B |",
        "|---|---|---|---|---|---|---|",
    ]
    for t in c.tasks:
        p = p_text(t.p_value) if t.evidence == "statistical" else "(same attempts)"
        out.append(
            f"| {_md(t.task)} | {_agent_rate_text(t.a)} | {_agent_rate_text(t.b)} | {p} | "
            f"{'**yes**' if t.gap else ''} | {_md(', '.join(t.box_a))} | {_md(', '.join(t.box_b))} |"
        )
    if c.left_out:
        out += ["", f"Left out (replayed by one run only): {_md(', '.join(c.left_out))}"]
    return "\n".join(out) + "\n"


def render_compare_json(c: Comparison) -> str:
    return c.model_dump_json(indent=2) + "\n"


def write_reports(run_dir: Path, report: RunReport, traces: TraceRecords | None = None) -> None:
    """Write ``report.json``, ``report.md``, ``junit.xml`` and ``report.html`` into the run directory
    (``traces``: the records the analysis kept, shown by the page without reading them again).
    Each file is written, atomically and flushed to disk, as soon as it is rendered, on a thread of
    its own: the four waits on the disk overlap (and the next file's rendering)."""
    with ThreadPoolExecutor(4, thread_name_prefix="crosshost-report") as pool:
        written = []

        def write(name: str, text: str) -> None:
            written.append(pool.submit(write_bytes_atomic, run_dir / name, text.encode()))

        write(REPORT_NAME, render_json(report))
        write("report.md", render_markdown(report))
        write("junit.xml", render_junit(report))
        write("report.html", render_html(report, run_dir, traces))
        for future in written:
            future.result()  # a file that could not be written fails the command, as before


def analyse_and_write(
    run_dir: Path, gate: float | None = None, selection: TaskSelection | None = None
) -> RunReport:
    """Analyse a run directory (``gate`` overrides the suite's) and write its reports into it; with a
    ``selection`` of its tasks, analyse those only and write nothing (a subset never replaces the
    run's own reports)."""
    if selection is not None and not selection.everything:
        return analyse_run(run_dir, gate=gate, selection=selection)
    traces = TraceRecords()  # each trace read once, for the analysis and the page
    report = analyse_run(run_dir, gate=gate, keep=traces)
    write_reports(run_dir, report, traces)
    return report


#: ``crosshost report --format``: the text renderers (``table`` is ``orchestrator.ui.report_table``)
FORMATS = {"md": render_markdown, "json": render_json, "junit": render_junit}
