"""What a host sent back, checked against what its runner said over the SSH channel.

The runner announces the sha256 of every file it closes in ``out/`` on the run exec's stdout
(``agent_runner/digests.py``), a stream the attempt cannot write. After the pull, every file that came
back must be one the runner announced, with the bytes it announced, and every announced file must have
come back. Then each results row's verdict is re-derived from its trace: the row and the trace's
finish record must agree, and a verdict of pass must be one the predicate's exit and the findings
allow. Any disagreement is the host's ``OutputTampered``: never a pass.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath

from agent_runner.digests import MARKER
from agent_runner.records import ResultRow, TraceFinish
from agent_runner.trace import read_trace
from orchestrator.errors import OutputTampered
from orchestrator.store.jsonl import iter_results

_LINE = re.compile(rf"^{MARKER} ([0-9a-f]{{64}}) (\S+)$")


def announced(stdout: str) -> tuple[dict[str, str], list[str]]:
    """path -> sha256 from the runner's stdout, and what was wrong with the lines (a path said twice
    with two digests)."""
    digests: dict[str, str] = {}
    problems: list[str] = []
    for line in stdout.splitlines():
        m = _LINE.match(line.strip())
        if m is None:
            continue
        sha, rel = m.groups()
        if digests.setdefault(rel, sha) != sha:
            problems.append(f"{rel} was announced twice with different digests")
    return digests, problems


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tampered_files(
    host_dir: Path,
    pulled: list[PurePosixPath],
    digests: dict[str, str],
    written: Mapping[PurePosixPath, str] | None = None,
) -> list[tuple[str, str]]:
    """Every way the pulled files differ from what the runner announced: (path, one plain line).
    ``written``: the pulled files' sha256 as the pull wrote them (``read_archive``); a file it does
    not name is read back and hashed."""
    said: list[tuple[str, str]] = []
    came = {p.as_posix(): p for p in pulled}
    for rel in sorted(came):
        want = digests.get(rel)
        if want is None:
            said.append((rel, f"{rel} is not a file the runner wrote"))
            continue
        got = (written or {}).get(came[rel]) or _sha256(host_dir / rel)
        if got != want:
            said.append((rel, f"{rel} differs from what the runner wrote"))
    said += [
        (rel, f"{rel} was written by the runner but did not come back") for rel in sorted(set(digests) - set(came))
    ]
    return said


def verdict_disagreements(
    host_dir: Path, expected: Mapping[str, Sequence[str]] | None = None
) -> list[tuple[str, str]]:
    """Each results row whose verdict its own trace does not bear out: (the trace, one plain line).
    ``expected``: per task, the findings a negative golden task declares ("kind:tool"): its pass."""
    said: list[tuple[str, str]] = []
    # a line that is not a row is the merge's to report (RunnerCrashed, the file kept aside)
    rows = [row for _, row in iter_results(host_dir / "results.jsonl", missing_ok=True, on_bad_line=_skip)]
    for row in rows:
        where = f"{row.task}.{row.attempt}"
        rel = f"traces/{where}.jsonl"
        if not (host_dir / rel).is_file():
            said.append((rel, f"results row {where} has no trace"))
            continue
        record = read_trace(host_dir / rel).finish or {}
        declared = (expected or {}).get(row.task, ())
        whys = _forged_fields(record) or _disagreement(row, TraceFinish.from_json(record), declared)
        said += [(rel, f"results row {where}: {why}") for why in whys]
    return said


def _skip(where: str, why: str) -> None:
    return None


#: the types the runner writes in a finish record's fields that a verdict rests on
_FINISH_TYPES: dict[str, tuple[type, ...]] = {
    "verdict": (str,), "predicate_exit": (int, type(None)), "findings": (list, type(None)),
}  # fmt: skip


def _forged_fields(record: Mapping[str, object]) -> list[str]:
    """A finish record's fields of a type the runner never writes: forged, never read leniently (the
    typed record would read them as absent)."""
    return [
        f"its trace's finish record has {key} {record[key]!r}, which the runner never writes"
        for key, types in _FINISH_TYPES.items()
        if key in record and (isinstance(record[key], bool) or not isinstance(record[key], types))
    ]


def _disagreement(row: ResultRow, finish: TraceFinish, declared: Sequence[str] = ()) -> list[str]:
    why: list[str] = []
    if finish.verdict != row.verdict:
        why.append(f"verdict {row.verdict} but its trace says {finish.verdict or None}")
    if finish.predicate_exit != row.exit_code:
        why.append(f"exit_code {row.exit_code} but its trace's predicate exited {finish.predicate_exit}")
    if row.verdict == "pass":
        if finish.predicate_exit not in (None, 0):
            why.append(f"pass although the predicate exited {finish.predicate_exit}")
        # a weak finding is reported and does not fail an attempt (docs/verdicts.md), nor does a
        # negative golden task's declared one
        if any(
            not (isinstance(f, dict) and (f.get("weak") is True or f"{f.get('kind')}:{f.get('tool')}" in declared))
            for f in finish.findings or []
        ):
            why.append("pass although its trace has contract findings")
    return why


def verify_host_output(
    host: str,
    host_dir: Path,
    pulled: list[PurePosixPath],
    stdout: str,
    expected: Mapping[str, Sequence[str]] | None = None,
    written: Mapping[PurePosixPath, str] | None = None,
) -> None:
    """Raise the host's ``OutputTampered`` naming the first disagreement (and how many in all). Every
    file found wrong is set aside as ``<name>.tampered`` first: nothing forged is analysed.
    ``written``: the pulled files' sha256 as the pull wrote them (not read back)."""
    digests, said = announced(stdout)
    problems = [("", why) for why in said] + tampered_files(host_dir, pulled, digests, written)
    if not problems:
        problems += verdict_disagreements(host_dir, expected)
    if not problems:
        return
    for rel, _ in problems:
        path = host_dir / rel
        if rel and path.is_file():
            path.replace(path.with_name(path.name + ".tampered"))
    more = f" ({len(problems)} problems in all)" if len(problems) > 1 else ""
    raise OutputTampered(
        host,
        f"{problems[0][1]}{more}; the host's results are not trusted (something on the host changed "
        "what the runner wrote; set aside as *.tampered)",
    )
