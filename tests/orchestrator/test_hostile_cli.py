"""Hostile names end to end, through the real command: a suite name full of Rich and Markdown markup,
a host whose hostname clears the screen, a host whose runner dies printing markup and control
characters. Every command runs to its own exit code and shows all of it as text."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

TRIAGE = Path(__file__).resolve().parents[2] / "examples" / "suites" / "triage"
CROSSHOST = Path(sys.executable).parent / "crosshost"
SUITE_NAME = "[/oops] [bold]x[/bold] *not em* <b>not html</b> `not code` a|b [link](http://x)"
HOSTNAME = "[/oops]\x1b[2J\x07YOUR RUN PASSED"
STDERR = "[/oops] \x1b[2J\x1b[HYOUR CROSSHOST RUN PASSED\x07"
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f]")
TASKS = "healthy-no-writes,label-honest-bug,colour-probe"

pytestmark = pytest.mark.root  # box-b is a host of its own hostname (unshare --uts)


@dataclass
class Project:
    dir: Path
    suite: Path
    run: Path

    def crosshost(self, *args: str) -> tuple[int, str]:
        done = subprocess.run([str(CROSSHOST), *args], capture_output=True, text=True, timeout=300, cwd=self.dir,
                              env={**os.environ, "COLUMNS": "400", "XDG_CACHE_HOME": str(self.dir / "cache")})  # fmt: skip
        out = done.stdout + done.stderr
        assert "internal error" not in out and "Traceback" not in out, out
        assert not RAW_CONTROL.search(out), repr(out)  # nothing a terminal would obey
        return done.returncode, out


def _wrapper(path: Path, python: str) -> str:
    """A host's `python`: the real one, after ``python`` (code run first) had its say."""
    path.write_text(f"#!/bin/sh\nexec {python} \"$@\"\n")
    path.chmod(0o755)
    return str(path)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Project:
    root = tmp_path_factory.mktemp("hostile")
    suite = root / "suite"
    shutil.copytree(TRIAGE, suite)
    toml = suite / "suite.toml"
    toml.write_text(re.sub(r"(?m)^name = .*$", lambda _: f"name = {json.dumps(SUITE_NAME)}", toml.read_text()))
    # a predicate that fails in colour on box-b (its hostname), as test runners print on a terminal
    shutil.copytree(suite / "tasks" / "feature-flag-probe", suite / "tasks" / "colour-probe")
    (suite / "tasks" / "colour-probe" / "repo" / "run_tests.sh").write_text(
        '#!/bin/sh\ncase "$(uname -n)" in *oops*) printf \'\\033[31mFAILED\\033[0m 3 tests \\a[/oops]\\n\'; exit 1;; esac\n'
        "printf '\\033[32mPASSED\\033[0m\\n'\n"
    )
    # box-b: its own UTS namespace and a hostname that clears the screen; box-c: a runner that dies shouting
    renamed = _wrapper(root / "renamed-python", "unshare --uts python3 -c " + shlex.quote(
        f"import os, socket, sys; socket.sethostname({HOSTNAME!r}); os.execvp('python3', ['python3'] + sys.argv[1:])"
    ) + " ")  # fmt: skip
    dying = root / "dying-python"
    dying.write_text(f"#!/bin/sh\nprintf '%s\\n' {shlex.quote(STDERR)} >&2\nexit 1\n")
    dying.chmod(0o755)
    (root / "hosts.toml").write_text(
        '[defaults]\nenv_allowlist = ["PATH", "LANG"]\n'
        f'[[hosts]]\nname = "local"\ntransport = "local"\nworkspace_root = "{root / "ws-a"}"\n'
        f'[[hosts]]\nname = "box-b"\ntransport = "local"\nworkspace_root = "{root / "ws-b"}"\npython = "{renamed}"\n'
        f'[[hosts]]\nname = "box-c"\ntransport = "local"\nworkspace_root = "{root / "ws-c"}"\npython = "{dying}"\n'
    )
    p = Project(root, suite, root)
    code, out = p.crosshost("replay", str(suite), "--tasks", TASKS, "--out", "runs")
    assert code == 3, out  # box-c failed
    assert "YOUR CROSSHOST RUN PASSED\\x07" in out and SUITE_NAME in " ".join(out.split())
    (p.run,) = (root / "runs").glob("2*")
    return p


def test_hosts_shows_a_hostname_that_clears_the_screen_as_text(project: Project) -> None:
    code, out = project.crosshost("hosts")
    assert code == 3 and "box-c: RunnerCrashed" in out, out  # box-c's runner dies
    row = next(line for line in out.splitlines() if "box-b" in line)
    assert "[/oops]\\x07YOUR RUN PASSED" in row  # the bell shown, the screen clear dropped


def test_report_table_md_and_junit_keep_every_name_as_text(project: Project) -> None:
    code, out = project.crosshost("report", str(project.run))
    assert code == 3 and SUITE_NAME in " ".join(out.split()) and "YOUR CROSSHOST RUN PASSED\\x07" in out, out
    code, xml = project.crosshost("report", str(project.run), "--format", "junit")
    suite = ET.fromstring(xml[: xml.index("</testsuites>") + len("</testsuites>")]).find("testsuite")
    assert suite is not None and suite.get("name") == f"crosshost.{SUITE_NAME}"
    written = ET.parse(project.run / "junit.xml").getroot().find("testsuite")
    assert written is not None and written.get("name") == f"crosshost.{SUITE_NAME}"
    errors = " ".join(e.text or "" for e in written.iter("error"))
    assert "YOUR CROSSHOST RUN PASSED\\x07" in errors  # box-c's last words, the screen clear dropped
    colour = next(c for c in written.iter("testcase") if c.get("name") == "colour-probe")
    failure = colour.find("failure")  # box-b flipped; its predicate's colour is gone, its words kept
    assert failure is not None and "FAILED 3 tests \\x07[/oops]" in (failure.text or ""), failure.text


def _md_text(md: str) -> str:
    """What a Markdown reader sees: the rendered document's text, markup and HTML tags gone."""
    html = MarkdownIt("commonmark").enable("table").render(md)
    return re.sub(r"<[^>]+>", "", html).replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"').replace(
        "&amp;", "&")  # fmt: skip


def test_report_md_renders_back_to_the_names_as_they_were(project: Project) -> None:
    md = (project.run / "report.md").read_text()
    assert not RAW_CONTROL.search(md)
    shown = _md_text(md)
    assert f"suite: {SUITE_NAME}" in shown, shown
    assert "YOUR CROSSHOST RUN PASSED\\x07" in shown


def test_history_and_repro_show_the_names_as_text(project: Project) -> None:
    code, out = project.crosshost("history", "--out", "runs", "--wide")
    assert code == 0 and "[/oops] [bold]x[/bold]" in out, out
    trace = project.run / "hosts" / "box-b" / "traces" / "healthy-no-writes.0.jsonl"
    code, out = project.crosshost("repro", str(trace), "--host", "box-b", "--against", "local", "--suite",
                                  str(project.suite), "--out", "runs")  # fmt: skip
    assert code == 0 and "behaved the same" in out, out
    code, out = project.crosshost("history", "--out", "runs")
    assert code == 0 and "repro-healthy-no-writes" in out, out
