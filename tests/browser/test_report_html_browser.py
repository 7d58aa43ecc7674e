"""report.html in a real headless Chromium (Debian's package; ``make setup`` installs it).

Never skipped: without Chromium these tests fail and say how to install it.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.analysis import analyse_run
from orchestrator.report import write_reports
from tests.support.html_run import HOSTILE_TASK, PREDICATE_OUTPUT, build_known_run
from tools.headless import Browser, Page, find_chromium

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if find_chromium() is None:
        pytest.fail(
            "no chromium on PATH: run `make setup` (it installs Debian's chromium) or apt-get install chromium"
        )
    with Browser() as b:
        yield b


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = build_known_run(tmp_path_factory.mktemp("runs"))
    write_reports(run, analyse_run(run))
    return run


def _open(browser: Browser, url: str) -> Page:
    page = browser.page()
    page.goto(url)
    page.wait_for("document.body.dataset.ready === '1'")
    return page


def test_the_page_loads_with_no_console_error_and_fetches_nothing(browser, run):
    page = _open(browser, (run / "report.html").as_uri())
    assert page.console_errors() == []
    assert page.requests() == [(run / "report.html").as_uri()]
    assert page.evaluate("document.getElementById('validity').textContent") == "valid"


def test_the_flip_matrix_holds_the_runs_cells(browser, run):
    page = _open(browser, (run / "report.html").as_uri())
    cells = page.evaluate(
        """[...document.querySelectorAll('#matrix tbody tr')].map(tr => ({
            task: tr.querySelector('.task-id').textContent,
            hosts: Object.fromEntries([...tr.querySelectorAll('td.cell')].map(td => [td.dataset.host,
                [...td.querySelectorAll('.v')].map(s => s.textContent + '|' + s.className)])),
            flip: tr.querySelector('.flip-mark').textContent,
            cls: tr.querySelector('.cls').textContent}))"""
    )
    by_task = {row["task"]: row for row in cells}
    assert list(by_task) == [HOSTILE_TASK, "agree-task", "flip-task"]
    flip = by_task["flip-task"]
    assert flip["hosts"] == {
        "local": ["pass|v pass", "pass|v pass"],
        "box-b": ["fail*|v fail flipped", "fail*|v fail flipped"],
        "box-c": ["pass|v pass", "pass|v pass"],
    }
    assert flip["flip"] == "← flip" and flip["cls"] == "host_coupling"
    assert by_task["agree-task"]["flip"] == "" and by_task["agree-task"]["cls"] == "agree"
    assert by_task[HOSTILE_TASK]["hosts"]["box-b"] == ["fail|v fail", "fail|v fail"]
    headers = page.evaluate("[...document.querySelectorAll('#matrix thead th')].map(th => th.textContent)")
    assert headers == ["task", "local (ref)", "box-b", "box-c", "flip", "classification", "action", "cause"]
    # before explain ran, the flipped task's cause is the attribution's own line
    assert page.evaluate(
        "document.querySelector('tr[data-task=\"flip-task\"] td.cause').textContent"
    ).startswith("box-b: ")


def test_selecting_a_task_shows_the_side_by_side_with_the_first_divergence_marked(browser, run):
    page = _open(browser, (run / "report.html").as_uri())
    assert page.evaluate("document.getElementById('task').hidden") is True
    page.evaluate("document.querySelector('#matrix tr[data-task=\"flip-task\"] td.cell').click()")
    page.wait_for("!document.getElementById('task').hidden")
    view = page.evaluate(
        """(() => {
            const block = document.querySelector('#task .host-block[data-host="box-b"]');
            const first = block.querySelector('tr.first-divergence');
            return {title: document.querySelector('#task h2').textContent,
                    note: block.querySelector('p.note').textContent,
                    rows: [...block.querySelectorAll('table.sbs tbody tr')].map(tr => tr.dataset.op),
                    firstOp: first.dataset.op,
                    firstCells: [...first.querySelectorAll('td')].map(td => td.textContent),
                    marked: block.querySelectorAll('tr.first-divergence').length,
                    predicate: [...block.querySelectorAll('.finish dd')].map(dd => dd.textContent),
                    output: [...block.querySelectorAll('.finish pre.predicate-output')].map(p => p.textContent)};
        })()"""
    )
    assert view["title"] == "flip-task"
    assert view["rows"] == ["equal", "extra", "equal"] and view["marked"] == 1
    assert view["note"] == "first divergence: box-b step 2 (extra on host)"
    assert view["firstOp"] == "extra"
    assert view["firstCells"][0] == "▶ first divergence" and view["firstCells"][2] == "—"
    assert view["firstCells"][4].startswith('http_get_health(url="http://127.0.0.1:9/health")')
    assert "box-b says active (running) [REDACTED] 2" in view["firstCells"][4]  # the observation
    assert "predicate exit 1: nginx still unhealthy" in view["predicate"]
    assert view["output"] == [PREDICATE_OUTPUT]  # box-b's side; the reference recorded none
    # box-c differs only in an argument value; the differing value is marked
    box_c = page.evaluate(
        """(() => { const b = document.querySelector('#task .host-block[data-host="box-c"]');
            return [b.querySelector('tr.first-divergence').dataset.op,
                    [...b.querySelectorAll('tr.first-divergence .arg-differs .val')].map(v => v.textContent)]; })()"""
    )
    assert box_c == ["values", ['"nginx.service"', '"nginx-alt.service"']]  # ref left, box-c right
    assert "attribution" in page.evaluate("document.getElementById('task').textContent").lower()
    assert page.console_errors() == []


def test_filters_by_classification_host_and_search(browser, run):
    page = _open(browser, (run / "report.html").as_uri())

    def visible() -> list[str]:
        return page.evaluate(
            "[...document.querySelectorAll('#matrix tbody tr')].filter(tr => !tr.hidden).map(tr => tr.dataset.task)"
        )

    def choose(element: str, value: str | bool) -> None:
        prop = "checked" if isinstance(value, bool) else "value"
        event = "input" if element == "f-search" else "change"
        page.evaluate(
            f"(() => {{ const e = document.getElementById('{element}'); e.{prop} = {json.dumps(value)};"
            f" e.dispatchEvent(new Event('{event}')); }})()"
        )

    choose("f-class", "host_coupling")
    assert visible() == ["flip-task"]
    choose("f-class", "")
    choose("f-search", "AGREE")
    assert visible() == ["agree-task"]
    choose("f-search", "")
    choose("f-host", "box-c")
    choose("f-flips", True)
    assert visible() == []  # box-c flips nothing
    choose("f-host", "box-b")
    assert visible() == ["flip-task"]
    shown_hosts = page.evaluate(
        "[...document.querySelectorAll('#matrix thead th.host-col')].filter(th => !th.hidden).map(th => th.dataset.host)"
    )
    assert shown_hosts == ["local", "box-b"]  # the chosen host beside the reference
    assert page.evaluate("document.getElementById('f-count').textContent") == "1 of 3 task(s)"


def test_hostile_markup_in_the_run_is_shown_as_text(browser, run):
    page = _open(
        browser,
        (run / "report.html").as_uri() + "#task=" + "%3Cimg%20src%3Dx%20onerror%3D%22window.pwned%3D1%22%3E",
    )
    page.wait_for("!document.getElementById('task').hidden")
    assert page.evaluate("typeof window.pwned") == "undefined"
    assert page.evaluate("document.querySelector('#task h2').textContent") == HOSTILE_TASK
    assert page.evaluate("document.querySelectorAll('img').length") == 0
    assert page.evaluate("document.querySelectorAll('script').length") == 2
    assert page.console_errors() == []
    assert page.requests() == [(run / "report.html").as_uri()]


def test_view_serve_serves_the_report_on_loopback_until_ctrl_c(browser, run):
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "view", "--serve", str(run)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"at (http://127\.0\.0\.1:\d+/report\.html) \(Ctrl-C to stop\)", line)
        assert match, line
        page = _open(browser, match.group(1))
        assert page.evaluate("document.querySelectorAll('#matrix tbody tr').length") == 3
        assert page.console_errors() == []
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_trend_is_drawn_from_the_history_index(browser, tmp_path):
    from orchestrator.store.history import record_run

    runs = tmp_path / "runs"
    for run_id, started in (
        ("20241230T000000Z-000001", "2024-12-30T00:00:00Z"),
        ("20241231T000000Z-000002", "2024-12-31T00:00:00Z"),
    ):
        old = build_known_run(runs, run_id, manifest_extra={"started": started})
        write_reports(old, analyse_run(old))
        record_run(runs, old)
    run = build_known_run(runs)
    write_reports(run, analyse_run(run))
    page = _open(browser, (run / "report.html").as_uri())
    trend = page.evaluate(
        """(() => { const svg = document.querySelector('#trend svg'); const r = svg.getBoundingClientRect();
            return {w: r.width, h: r.height, lines: svg.querySelectorAll('polyline').length,
                    points: svg.querySelectorAll('circle').length,
                    legend: [...document.querySelectorAll('#trend .legend li')].map(li => li.textContent)}; })()"""
    )
    assert trend["w"] > 300 and trend["h"] > 100
    assert trend["lines"] == 4 and trend["points"] == 3 * 4  # 3 runs x (flip rate + 3 hosts)
    assert trend["legend"] == ["flip rate", "local pass rate", "box-b pass rate", "box-c pass rate", "gate"]
    assert page.console_errors() == []


def test_explain_evidence_and_the_cause_are_on_the_page(browser, tmp_path):
    """With an explain.json the flipped task's row carries explain's one-line cause, and its task view
    the whole evidence: replayed once more, each counterfactual (the reproducing one marked), the
    differing paths as sentences, what was not collected; the overview says what explain spent."""
    from orchestrator.analysis.models import Counterfactual, ExplainRecord, ExplainTask, PathEvidence
    from orchestrator.store.rundir import RunDir

    run = build_known_run(tmp_path / "runs")
    hostile = "/opt/<b>flag</b>"
    record = ExplainRecord(
        run_id="20250101T000000Z-abcdef", reference="local", replays=3, seconds=4.5, max_counterfactuals=8,
        tasks=[ExplainTask(
            task="flip-task", again={"local": "pass", "box-b": "fail"},
            counterfactuals=[
                Counterfactual(host="box-b", fact="LANG", value=None, verdict="fail", reproduces=True),
                Counterfactual(host="box-b", fact="TZ", value="UTC", verdict="pass", reproduces=False),
            ],
            paths=[PathEvidence(path=hostile, calls=["openat"], touched_on=["local", "box-b"], by=["agent"],
                                state={"local": "absent", "box-b": "file 3 bytes sha256 0123456789abcdef"})],
            not_collected=["file evidence not collected on box-c: strace is not in this host's system directories"],
        )],
    )  # fmt: skip
    RunDir(run).explain_path.write_text(record.model_dump_json())
    write_reports(run, analyse_run(run))
    page = _open(browser, (run / "report.html").as_uri())
    assert page.console_errors() == []
    cause = page.evaluate("document.querySelector('tr[data-task=\"flip-task\"] td.cause').textContent")
    assert cause.startswith(
        "with box-b's LANG (unset), local fails too; the agent read /opt/<b>flag</b>: "
        "present on box-b (file 3 bytes sha256 0123456789abcdef), absent on local"
    ), cause
    assert page.evaluate("document.querySelector('tr[data-task=\"agree-task\"] td.cause').textContent") == ""
    assert page.evaluate("document.getElementById('explain-cost').textContent").startswith(
        "explain: 3 replay(s) in 4.5 s for 1 flipped task(s)"
    )
    page.evaluate("location.hash = 'task=flip-task'")
    page.wait_for("document.getElementById('explain') !== null")
    shown = page.evaluate(
        """(() => { const x = document.getElementById('explain');
            return {head: x.querySelector('h3').textContent,
                    items: [...x.querySelectorAll('li')].map(li => [li.textContent, li.className]),
                    cause: document.querySelector('#task .cause-line').textContent,
                    markup: x.querySelectorAll('b').length}; })()"""
    )
    assert shown["head"] == "Explain: replayed once more: local pass, box-b fail"
    assert shown["items"] == [
        ["local with box-b's LANG (unset): fail, reproduces the flip", "reproduces"],
        ["local with box-b's TZ (UTC): pass, does not reproduce it", ""],
        ["the agent read /opt/<b>flag</b>: present on box-b (file 3 bytes sha256 0123456789abcdef), absent on local", ""],
        ["file evidence not collected on box-c: strace is not in this host's system directories", ""],
    ]
    assert shown["cause"] == "cause: " + cause and shown["markup"] == 0  # a path's markup is text
    # the evidence is not shown a second time as a raw JSON blob
    assert page.evaluate("[...document.querySelectorAll('#task h3')].map(h => h.textContent)").count("explain") == 0


def test_a_tasks_leaks_and_weak_findings_show_their_rule_and_evidence(browser, tmp_path):
    from tests.support.rundirs import Attempt, RunSpec, build_run, fingerprint

    hosts = {"vm": fingerprint("vm", "a" * 16), "box-b": fingerprint("box-b", "b" * 16, python="CPython 3.11.9")}
    calls = {"vm": "record-for-vm", "box-b": "record-for-box-b"}
    attempts = {(h, "t1", 0): Attempt("pass", calls=[("restart_unit", {"unit": "x", "reason": calls[h]}),
                                                      ("restart_unit", {"unit": "x", "reason": "vm.swappiness"})])
                for h in hosts}  # fmt: skip
    run = build_run(tmp_path / "runs", RunSpec(hosts=hosts, attempts=attempts))
    write_reports(run, analyse_run(run))
    page = _open(browser, (run / "report.html").as_uri() + "#task=t1")
    page.wait_for("!document.getElementById('task').hidden")
    lists = page.evaluate(
        """Object.fromEntries([...document.querySelectorAll('#task h3')].filter(h => h.nextElementSibling &&
            h.nextElementSibling.tagName === 'UL').map(h => [h.textContent,
            [...h.nextElementSibling.querySelectorAll('li')].map(li => li.textContent)]))"""
    )
    leaks = lists["Leaks"]
    assert any(line.startswith("vm attempt 0 step 1: hostname [cross_host]: ") and "'record-for-box-b'" in line
               for line in leaks), leaks  # fmt: skip
    weak = lists["Weak findings (not leaks: no cross-host evidence)"]
    assert any(line.startswith("vm attempt 0 step 2: hostname [generic_hostname]: ") for line in weak), weak
    assert page.console_errors() == []
