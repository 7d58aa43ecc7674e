"""Attribution: which host facts differ between the reference and a flipped host, most relevant first.

A fingerprint fact is *tied* to a task when the task's own words (its predicate's output, the
verdict's reason, the argument values of its tool calls) name the fact or one of its two values: a
``locale-probe`` that prints ``LANG=unset`` ties ``locale.LANG``. Tied facts come first, then the
facts a program reads most often (locale, time zone, the interpreter, paths), the host's name and
the fingerprint's own bookkeeping last. Values are kept whole; only the terminal's one-line cause
is shortened, and then at a word boundary. ``crosshost explain`` evidence, when the run has it,
comes before all of this (``explain.py``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agent_runner.fingerprint import NOT_DIGESTED
from agent_runner.records import Fingerprint
from agent_runner.textguard import one_line
from orchestrator.analysis.models import (
    Attribution,
    Counterfactual,
    ExplainRecord,
    ExplainTask,
    FieldDiff,
    PathEvidence,
)
from orchestrator.dotted import flatten

# What the digest leaves out is no lead either: the digest itself, the capture time, the run's own
# working directory (each host's workspace has a path of its own) and the machine identity (a hash).
_NOT_HOST_FACTS = NOT_DIGESTED

# Prior order of facts no task named: what a test most often reads first, bookkeeping last.
_PRIOR = (
    "locale.",
    "tz.",
    "env.",
    "path",
    "python",
    "platform",
    "machine",
    "uid",
    "home",
    "cwd",
    "user_home_in_cwd",
    "has_local_dotenv",
    "cpu_count",
    "hostname",
    "env_keys",
    "findings",
)

# Values too common to tie a fact to a task by appearing in its text.
_MIN_VALUE = 3
_COMMON = {"true", "false", "none", "null", "utf-8", "utf8", "unset", "root"}


def leaf_text(leaf: Any) -> str:
    """A leaf as shown in a report: the string itself, or its JSON; never cut."""
    return leaf if isinstance(leaf, str) else json.dumps(leaf, sort_keys=True)


def fingerprint_differences(a: Fingerprint | None, b: Fingerprint | None) -> list[tuple[str, Any, Any]]:
    """(dotted field, value on a, value on b) for every fingerprint field that differs, sorted by field;
    a field one side lacks is None there. The one comparison of two hosts' fingerprints."""
    left = flatten({k: v for k, v in (a.to_json() if a else {}).items() if k not in _NOT_HOST_FACTS})
    right = flatten({k: v for k, v in (b.to_json() if b else {}).items() if k not in _NOT_HOST_FACTS})
    return [
        (k, left.get(k), right.get(k))
        for k in sorted(left.keys() | right.keys())
        if left.get(k) != right.get(k)
    ]


def _prior(field: str) -> float:
    low = field.lower()
    for rank, prefix in enumerate(_PRIOR):
        if low.startswith(prefix):
            return rank
    return _PRIOR.index("hostname") - 0.5  # an unknown fact: before the host's name and the bookkeeping


def offset_forms(seconds: int) -> list[str]:
    """How programs print a UTC offset of ``seconds``: ``-0500``, ``-05:00``, ``UTC-5``/``GMT-5``
    (``UTC+5:30`` for a part hour)."""
    sign = "-" if seconds < 0 else "+"
    hours, minutes = divmod(abs(seconds) // 60, 60)
    short = f"{hours}" + (f":{minutes:02d}" if minutes else "")
    return [f"{sign}{hours:02d}{minutes:02d}", f"{sign}{hours:02d}:{minutes:02d}", f"UTC{sign}{short}", f"GMT{sign}{short}"]


def value_forms(field: str, value: str) -> list[str]:
    """The texts a fact's value shows up as in a program's output: the value itself, each element of a
    list (``tz.tzname`` ``["EST", "EDT"]``), and a UTC offset in seconds as programs print it."""
    forms = [value]
    if value.startswith("["):
        try:
            items = json.loads(value)
        except ValueError:
            items = []
        forms = [str(x) for x in items if isinstance(x, str | int) and not isinstance(x, bool)] if isinstance(items, list) else []
    if field.endswith("utc_offset_s") and re.fullmatch(r"-?\d+", value):
        forms += offset_forms(int(value))
    return forms


def _tie(field: str, values: Iterable[str | None], text: str) -> str | None:
    """What in the task's text names ``field`` (its last dotted part, or one of its values in any
    form ``value_forms`` knows), else None."""
    leaf = field.rsplit(".", 1)[-1]
    if len(leaf) >= 2 and re.search(rf"(?<![A-Za-z0-9_]){re.escape(leaf)}(?![A-Za-z0-9_])", text):
        return f"the task's output names {leaf}"
    for value in values:
        if value is None or value.startswith("{"):
            continue
        for form in value_forms(field, value):
            if len(form) < _MIN_VALUE or form.lower() in _COMMON:
                continue
            if form in text:
                return f"the task's output shows {form!r}" + ("" if form == value else f" ({field} {value})")
    return None


def attribution(
    reference: str,
    ref_fp: Fingerprint | None,
    host: str,
    host_fp: Fingerprint | None,
    task_text: str = "",
) -> Attribution:
    """The fingerprint fields (flattened, dotted) that differ between the reference and ``host``,
    ranked for the task whose words are ``task_text``: tied facts first, then by ``_PRIOR``. A null
    leaf stays null: "LANG unset" must not read as the string "null"."""
    fields: list[FieldDiff] = []
    for key, left, right in fingerprint_differences(ref_fp, host_fp):
        ref_text = None if left is None else leaf_text(left)
        other_text = None if right is None else leaf_text(right)
        fields.append(
            FieldDiff(
                field=key,
                reference=ref_text,
                other=other_text,
                tied=_tie(key, (ref_text, other_text), task_text),
            )
        )
    fields.sort(key=lambda f: (f.tied is None, _prior(f.field), f.field))
    return Attribution(host=host, reference=reference, fields=fields)


def shown(value: str | None) -> str:
    """A fact's value in a sentence: an unset value says so."""
    return "unset" if value is None else value


def cut_words(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` characters, cut at a word boundary with an ellipsis."""
    if len(text) <= limit:
        return text
    head = text[: limit - 1]
    space = head.rfind(" ")
    return (head[:space] if space > limit // 3 else head).rstrip(" ,;") + "…"


def cause_line(attributions: Iterable[Attribution], *, explained: bool = False) -> str:
    """One line per flipped task: the tied facts, else the count of differing facts and, before
    ``crosshost explain`` ran on the run, that it looks further."""
    parts: list[str] = []
    for attr in attributions:
        tied = [f for f in attr.fields if f.tied]
        if tied:
            facts = ", ".join(f"{f.field} {shown(f.reference)} → {shown(f.other)}" for f in tied)
            parts.append(f"{attr.host}: {facts}")
        elif attr.fields:
            further = "" if explained else "; crosshost explain looks further"
            parts.append(f"{attr.host}: no differing fact named by the task ({len(attr.fields)} differ){further}")
        else:
            parts.append(f"{attr.host}: same fingerprint")
    return "; ".join(parts)


def read_explain(path: Path, problems: list[str]) -> ExplainRecord | None:
    """``explain.json`` when the run has one; a damaged one is a problem of the run, not a crash."""
    if not path.is_file():
        return None
    try:
        return ExplainRecord.model_validate_json(path.read_bytes())
    except (OSError, ValueError) as exc:
        problems.append(f"{path}: unreadable explain evidence ({str(exc).splitlines()[0]}); run crosshost explain again")
        return None


def counterfactual_line(cf: Counterfactual, reference: str) -> str:
    """"with box-b's LANG (unset), local fails too"."""
    value = "unset" if cf.value is None else one_line(cf.value)
    return f"with {cf.host}'s {cf.fact} ({value}), {reference} {cf.verdict}s too"


def trial_line(cf: Counterfactual, reference: str) -> str:
    """"local with box-b's LANG (unset): fail, reproduces the flip": one counterfactual as tried."""
    value = "unset" if cf.value is None else one_line(cf.value)
    said = "reproduces the flip" if cf.reproduces else "does not reproduce it"
    return f"{reference} with {cf.host}'s {cf.fact} ({value}): {cf.verdict or 'no verdict'}, {said}"


def again_line(entry: ExplainTask) -> str:
    """"replayed once more: local pass, box-b fail" (empty when explain replayed nothing)."""
    if not entry.again:
        return ""
    return "replayed once more: " + ", ".join(f"{h} {v or 'no verdict'}" for h, v in entry.again.items())


MAX_CAUSE_PATHS = 2  # differing paths named in the one-line cause (report.md lists every one)
_VERBS = (("execve", "executed"), ("open", "read"), ("getdents", "listed"))


_WHO = {"predicate": "run_tests.sh", "agent": "the agent"}


_UNUSABLE = ("character device", "block device")  # where a program or a file should be


def _state_on(host: str, state: str) -> str:
    if state == "absent":
        return f"absent on {host}"
    if state in _UNUSABLE:
        return f"unusable on {host} ({state})"
    return f"present on {host} ({one_line(state)})"


def path_line(evidence: PathEvidence) -> str:
    """"run_tests.sh read /opt/x/feature.flag: present on box-b (file 0 bytes …), absent on local"
    ("the agent read …" for a path only the agent's processes or its tools touched; "(also /bin/jq)"
    for the other spellings of one file through a directory link)."""
    verb = next((v for prefix, v in _VERBS if any(c.startswith(prefix) for c in evidence.calls)), "looked up")
    who = " and ".join(_WHO.get(side, side) for side in evidence.by) or _WHO["predicate"]
    also = f" (also {', '.join(one_line(a) for a in evidence.aliases)})" if evidence.aliases else ""

    def order(hs: tuple[str, str]) -> int:
        return 0 if hs[1] in _UNUSABLE else 2 if hs[1] == "absent" else 1

    parts = [_state_on(host, state) for host, state in sorted(evidence.state.items(), key=order)]
    # the path is a host's: a newline in a file's name must not add a line to what it is shown in
    return f"{who} {verb} {one_line(evidence.path)}{also}: " + ", ".join(parts)


def explain_cause(entry: ExplainTask, reference: str) -> str:
    """The explain evidence in a line: the facts that alone reproduce the other verdict, else what was
    tried; what was not collected is in report.md, not here."""
    named = [counterfactual_line(cf, reference) for cf in entry.counterfactuals if cf.reproduces]
    named += [path_line(p) for p in entry.paths[:MAX_CAUSE_PATHS]]
    if len(entry.paths) > MAX_CAUSE_PATHS:
        named.append(f"{len(entry.paths) - MAX_CAUSE_PATHS} more differing path(s) in report.md")
    if named:
        return "; ".join(named)
    if entry.counterfactuals:
        facts = ", ".join(f"{cf.host}'s {cf.fact}" for cf in entry.counterfactuals)
        return f"no single environment fact reproduces it (tried {facts})"
    return ""


def explain_spent(record: ExplainRecord) -> str:
    """What explain cost, said once per run."""
    tried = sum(len(t.counterfactuals) for t in record.tasks)
    line = (
        f"explain: {record.replays} replay(s) in {record.seconds:g} s for {len(record.tasks)} flipped task(s), "
        f"{tried} counterfactual verdict(s) (at most {record.max_counterfactuals} counterfactual replays)"
    )
    return line + (f"; left out: {', '.join(record.skipped)}" if record.skipped else "")
