"""The held model: every host of a run gets the reference host's model answers.

With a live model, each host's attempt samples its own answers, so a verdict difference mixes the
model's noise with the host's effect. Holding the model removes the noise: the reference host runs
first, its proxy records each model exchange per task and attempt; then every other host runs, and
its proxy answers request k of an attempt from the reference's record while the request equals the
recorded one (same messages, tools and sampling settings). At the first request that differs
(usually because a tool observation differed on this host) the divergence is recorded (task,
attempt, request index, the first differing message and a short diff of it) and, from there on, the
attempt is answered live (``hold_model = true``) or ends with finish reason ``model_diverged``
(``"strict"``).

No waiting, no race: the other hosts start only once the reference host's run has ended (the
reference leads), so the whole record exists before anyone reads it. A reference that recorded
nothing for an attempt (it failed, or never asked the model) leaves that attempt unheld: answered
live and reported so.

The record holds request bodies and the provider's answers, never a key or header.
"""

from __future__ import annotations

import difflib
import json
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_runner.jsonfile import loads as json_loads
from orchestrator.model.apis.openai_chat import OpenAIChat
from orchestrator.store.rundir import RunDir, iter_jsonl

MAX_TEXT = 300
MAX_DIFF_LINES = 12
#: what of a request a held model compares (an API module's ``comparable``): its conversation under
#: ``messages`` and its settings
Comparable = Callable[[dict[str, Any]], dict[str, Any]]


def hold_mode(agent: dict[str, Any] | None, override: bool | None) -> str | None:
    """``"true"``, ``"strict"`` or None (not held): the suite's ``hold_model`` (default true for a live
    model), ``--hold-model``/``--no-hold-model`` over it."""
    if agent is None:
        return None
    if override is not None:
        return "true" if override else None
    value = agent.get("hold_model", True)
    if value == "strict":
        return "strict"
    return "true" if value is True else None


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


# An exec attempt's directory (its workspace, HOME and TMPDIR) is a path of each host's own; an agent
# that tells its model where it works (Claude Code: its working directory, and a directory named after
# it with every character but letters and digits as "-") would diverge at its first request. Requests
# are compared with that path set aside, in both spellings; a held answer gets the host's own.
ROOT_MARKS = ("{crosshost_attempt_dir}", "{crosshost_attempt_dir_slug}")


def _spellings(root: str | None) -> tuple[str, ...]:
    return (root, re.sub(r"[^A-Za-z0-9]", "-", root)) if root else ()


def attempt_root(value: Any) -> str | None:
    """An attempt directory a runner named, or None: an absolute path three directories deep or more,
    of characters JSON writes as they are (a replacement must keep a body JSON)."""
    if not isinstance(value, str) or not value.startswith("/") or len([p for p in value.split("/") if p]) < 3:
        return None
    return value if all(c.isprintable() and c not in '"\\' for c in value) else None


def _rewrite(obj: Any, old: tuple[str, ...], new: tuple[str, ...]) -> Any:
    if not old or old == new:
        return obj
    text = _canonical(obj)
    for before, after in zip(old, new, strict=True):
        text = text.replace(before, after)
    return json.loads(text)


def set_aside(body: Any, root: str | None) -> Any:
    """``body`` with the attempt's directory ``root`` replaced by a mark, in both spellings."""
    return _rewrite(body, _spellings(root), ROOT_MARKS if root else ())


def moved(answer: dict[str, Any], reference_root: str | None, root: str | None) -> dict[str, Any]:
    """The reference's answer with its attempt directory replaced by this host's (a streamed answer's
    path split across two events keeps the reference's: the next request then differs)."""
    if not reference_root or not root:
        return answer
    result: dict[str, Any] = _rewrite(answer, _spellings(reference_root), _spellings(root))
    return result


def _text(message: Any) -> str:
    """A message as text for a person: its content, else its tool calls."""
    if not isinstance(message, dict):
        return _canonical(message)
    content = message.get("content")
    if isinstance(content, str) and content:
        return content
    return _canonical({k: v for k, v in message.items() if k != "role"})


@dataclass
class Divergence:
    task: str
    attempt: int
    host: str
    request: int  # 0-based index of the request in the attempt
    message: int | None  # index of the first differing message (None: settings or tools differ)
    role: str | None
    reference: str
    other: str
    diff: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "attempt": self.attempt,
            "host": self.host,
            "request": self.request,
            "message": self.message,
            "role": self.role,
            "reference": self.reference,
            "other": self.other,
            "diff": self.diff,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Divergence:
        diff = data.get("diff")
        return cls(
            task=str(data.get("task") or ""),
            attempt=_count_of(data.get("attempt")),
            host=str(data.get("host") or ""),
            request=_count_of(data.get("request")),
            message=data["message"] if isinstance(data.get("message"), int) else None,
            role=data["role"] if isinstance(data.get("role"), str) else None,
            reference=str(data.get("reference") or ""),
            other=str(data.get("other") or ""),
            diff=[str(line) for line in diff] if isinstance(diff, list) else [],
        )


def _count_of(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _counts(value: Any) -> dict[str, int]:
    """``{attempt key: requests}``; entries of another shape are left out."""
    return {k: _count_of(v) for k, v in value.items() if isinstance(k, str)} if isinstance(value, dict) else {}


@dataclass
class HoldSummary:
    """``model_hold.json``: what the held model did in one run (docs/held-model.md). Written by
    ``ModelHold.write`` and read back only through ``read``; an entry of the wrong shape reads as
    absent (the analysis then says the requests were not held, never more)."""

    mode: str
    reference: str
    #: attempt key (``<task>.<attempt>``) -> the reference's requests recorded in it
    recorded: dict[str, int] = field(default_factory=dict)
    #: host -> attempt key -> requests answered from the record, and answered live
    held: dict[str, dict[str, int]] = field(default_factory=dict)
    live: dict[str, dict[str, int]] = field(default_factory=dict)
    divergences: list[Divergence] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "reference": self.reference,
            "recorded": dict(sorted(self.recorded.items())),
            "held": {h: dict(sorted(v.items())) for h, v in sorted(self.held.items())},
            "live": {h: dict(sorted(v.items())) for h, v in sorted(self.live.items())},
            "divergences": [d.to_json() for d in self.divergences],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> HoldSummary:
        per_host: dict[str, dict[str, dict[str, int]]] = {"held": {}, "live": {}}
        for table in per_host:
            value = data.get(table)
            if isinstance(value, dict):
                per_host[table] = {h: _counts(v) for h, v in value.items() if isinstance(h, str)}
        divergences = data.get("divergences")
        return cls(
            mode=str(data.get("mode") or ""),
            reference=str(data.get("reference") or ""),
            recorded=_counts(data.get("recorded")),
            held=per_host["held"],
            live=per_host["live"],
            divergences=[Divergence.from_json(d) for d in divergences if isinstance(d, dict)]
            if isinstance(divergences, list)
            else [],
        )

    @classmethod
    def read(cls, run_dir: RunDir) -> HoldSummary | None:
        """The run's summary, or None when the run did not hold its model (or the file is unreadable)."""
        try:
            data = json_loads(run_dir.model_hold_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return cls.from_json(data) if isinstance(data, dict) else None

    def recorded_requests(self, keys: list[str]) -> int:
        """The reference's requests in the attempts ``keys``."""
        return sum(self.recorded.get(k, 0) for k in keys)

    def held_requests(self, host: str, keys: list[str]) -> int:
        """How many of ``host``'s model requests in the attempts ``keys`` were answered from the record."""
        mine = self.held.get(host, {})
        return sum(mine.get(k, 0) for k in keys)


def first_difference(reference: dict[str, Any], other: dict[str, Any]) -> tuple[int | None, str | None, str, str]:
    """(message index, role, reference text, other text) of the first difference of two requests'
    comparable views (``messages``, then each setting)."""
    ref_msgs = reference.get("messages") or []
    oth_msgs = other.get("messages") or []
    for i in range(max(len(ref_msgs), len(oth_msgs))):
        r = ref_msgs[i] if i < len(ref_msgs) else None
        o = oth_msgs[i] if i < len(oth_msgs) else None
        if _canonical(r) != _canonical(o):
            role = (o or r or {}).get("role") if isinstance(o or r, dict) else None
            return i, role, "" if r is None else _text(r), "" if o is None else _text(o)
    for key in (k for k in {**reference, **other} if k != "messages"):
        if _canonical(reference.get(key)) != _canonical(other.get(key)):
            return None, None, f"{key}: {_canonical(reference.get(key))}", f"{key}: {_canonical(other.get(key))}"
    return None, None, "", ""


def _split_key(key: str) -> tuple[str, int]:
    task, _, attempt = key.rpartition(".")
    return (task, int(attempt)) if task and attempt.isdigit() else (key, 0)


class ModelHold:
    """One run's held model: the reference's record and what every other host made of it."""

    def __init__(self, reference: str, mode: str) -> None:
        self.reference = reference
        self.mode = mode  # "true" or "strict"
        self.reference_done = threading.Event()
        self._lock = threading.Lock()
        self._record: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {}
        self._roots: dict[str, str] = {}  # key -> the reference's attempt directory (exec agents)
        self._next: dict[tuple[str, str], int] = {}  # (host, key) -> index of its next request
        self._diverged: set[tuple[str, str]] = set()
        self.held: dict[str, dict[str, int]] = {}  # host -> key -> requests answered from the record
        self.live: dict[str, dict[str, int]] = {}  # host -> key -> requests answered live
        self.divergences: list[Divergence] = []

    # -- the reference ------------------------------------------------------------------------

    def record(self, key: str, request: dict[str, Any], answer: dict[str, Any], root: str | None = None) -> None:
        """``root``: the attempt's directory on the reference (an exec agent's), set aside when compared."""
        with self._lock:
            self._record.setdefault(key, []).append((request, answer))
            if root:
                self._roots[key] = root

    # -- every other host ---------------------------------------------------------------------

    def follow(self, host: str, key: str, request: dict[str, Any], root: str | None = None,
               comparable: Comparable | None = None) -> dict[str, Any] | None:
        """The recorded answer to ``host``'s next request of attempt ``key``, or None: answer it live
        (mode true) or end the attempt (``diverged(host, key)`` then says so, mode strict). ``root``:
        the attempt's directory on ``host`` (an exec agent's); ``comparable``: what of a request its
        API compares (default: OpenAI chat completions')."""
        view = comparable or OpenAIChat().comparable
        with self._lock:
            reference_root = self._roots.get(key)
            request = set_aside(request, root)
            index = self._next.get((host, key), 0)
            self._next[(host, key)] = index + 1
            if (host, key) in self._diverged:
                self._count(self.live, host, key)
                return None
            recorded = self._record.get(key)
            if not recorded:  # the reference never asked the model in this attempt: nothing to hold
                self._count(self.live, host, key)
                return None
            recorded = [(view(set_aside(req, reference_root)), answer) for req, answer in recorded]
            request = view(request)
            if index < len(recorded) and _canonical(recorded[index][0]) == _canonical(request):
                self._count(self.held, host, key)
                return moved(recorded[index][1], reference_root, root)
            self._diverged.add((host, key))
            self._count(self.live, host, key)
            self.divergences.append(self._divergence(host, key, index, request, recorded))
            return None

    def diverged(self, host: str, key: str) -> bool:
        with self._lock:
            return (host, key) in self._diverged

    def _divergence(
        self, host: str, key: str, index: int, request: dict[str, Any], recorded: list[tuple[dict[str, Any], Any]]
    ) -> Divergence:
        task, attempt = _split_key(key)
        if index >= len(recorded):
            ref_text = f"(the reference made {len(recorded)} request(s) in this attempt)"
            return Divergence(task, attempt, host, index, None, None, ref_text, "a further request")
        message, role, ref_text, other_text = first_difference(recorded[index][0], request)
        lines = difflib.unified_diff(ref_text.splitlines(), other_text.splitlines(), lineterm="", n=1)
        diff = [line for line in list(lines)[2:] if not line.startswith("@@")][:MAX_DIFF_LINES]
        return Divergence(
            task, attempt, host, index, message, role, ref_text[:MAX_TEXT], other_text[:MAX_TEXT], diff
        )

    @staticmethod
    def _count(table: dict[str, dict[str, int]], host: str, key: str) -> None:
        per_host = table.setdefault(host, {})
        per_host[key] = per_host.get(key, 0) + 1

    # -- the run directory --------------------------------------------------------------------

    def summary(self) -> HoldSummary:
        with self._lock:
            return HoldSummary(
                mode=self.mode,
                reference=self.reference,
                recorded={key: len(v) for key, v in self._record.items()},
                held={h: dict(v) for h, v in self.held.items()},
                live={h: dict(v) for h, v in self.live.items()},
                divergences=list(self.divergences),
            )

    def write(self, run_dir: RunDir, write: Callable[[Path, bytes], None]) -> None:
        """``model_hold.json`` (the summary) and ``model_record.jsonl`` (the reference's exchanges)."""
        with self._lock:
            lines = [
                _canonical({"attempt": key, "request": i, "body": req, "answer": ans}) + "\n"
                for key, exchanges in sorted(self._record.items())
                for i, (req, ans) in enumerate(exchanges)
            ]
        write(run_dir.model_record_path, "".join(lines).encode())
        write(run_dir.model_hold_path, (json.dumps(self.summary().to_json(), indent=2, sort_keys=True) + "\n").encode())



def merge_hold(shards: list[RunDir], target: RunDir, write: Callable[[Path, bytes], None]) -> None:
    """``target``'s held-model files from its shards' (``crosshost merge``): each shard held the model
    for its own tasks, so their attempts are disjoint and the run's record is every shard's
    exchanges, in the order a run writes them; the summary's tables are joined and the
    divergences listed shard by shard."""
    exchanges: list[tuple[str, int, str]] = []
    merged: HoldSummary | None = None
    for shard in shards:
        for _, row in iter_jsonl(shard.model_record_path, missing_ok=True):
            exchanges.append((str(row.get("attempt")), int(row.get("request") or 0), _canonical(row) + "\n"))
        part = HoldSummary.read(shard)
        if part is None:
            continue
        if merged is None:
            merged = HoldSummary(part.mode, part.reference)
        merged.recorded.update(part.recorded)
        for mine, theirs in ((merged.held, part.held), (merged.live, part.live)):
            for host, counts in theirs.items():
                mine.setdefault(host, {}).update(counts)
        merged.divergences += part.divergences
    write(target.model_record_path, "".join(line for _, _, line in sorted(exchanges)).encode())
    if merged is not None:
        write(target.model_hold_path, (json.dumps(merged.to_json(), indent=2, sort_keys=True) + "\n").encode())
