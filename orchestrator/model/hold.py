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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from agent_runner.jsonfile import JSONObject, JSONValue
from agent_runner.jsonfile import loads as json_loads
from orchestrator.model.apis.base import RequestView
from orchestrator.model.apis.openai_chat import OpenAIChat
from orchestrator.model.exchanges import listing, mapping
from orchestrator.store.jsonl import iter_jsonl
from orchestrator.store.rundir import RunDir

if TYPE_CHECKING:
    from orchestrator.model.settings import ProxyConfig

MAX_TEXT = 300
MAX_DIFF_LINES = 12
#: what of a request a held model compares (an API module's ``comparable``)
Comparable = Callable[[JSONObject], RequestView]


def hold_mode(config: ProxyConfig | None, override: bool | None) -> str | None:
    """``"true"``, ``"strict"`` or None (not held): the suite's ``hold_model`` (default true for a live
    model), ``--hold-model``/``--no-hold-model`` over it; ``config`` None: no live model."""
    if config is None:
        return None
    if override is not None:
        return "true" if override else None
    value = config.hold_model
    if value == "strict":
        return "strict"
    return "true" if value is True else None


def _canonical(obj: object) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


# An exec attempt's directory (its workspace, HOME and TMPDIR) is a path of each host's own; an agent
# that tells its model where it works (Claude Code: its working directory, and a directory named after
# it with every character but letters and digits as "-") would diverge at its first request. Requests
# are compared with that path set aside, in both spellings; a held answer gets the host's own.
ROOT_MARKS = ("{crosshost_attempt_dir}", "{crosshost_attempt_dir_slug}")


def _spellings(root: str | None) -> tuple[str, ...]:
    return (root, re.sub(r"[^A-Za-z0-9]", "-", root)) if root else ()


def attempt_root(value: JSONValue) -> str | None:
    """An attempt directory a runner named, or None: an absolute path three directories deep or more,
    of characters JSON writes as they are (a replacement must keep a body JSON)."""
    if not isinstance(value, str) or not value.startswith("/") or len([p for p in value.split("/") if p]) < 3:
        return None
    return value if all(c.isprintable() and c not in '"\\' for c in value) else None


def _rewrite(obj: JSONObject, old: tuple[str, ...], new: tuple[str, ...]) -> JSONObject:
    if not old or old == new:
        return obj
    text = _canonical(obj)
    for before, after in zip(old, new, strict=True):
        text = text.replace(before, after)
    # a replacement keeps the document JSON (attempt_root) and an object an object
    result: JSONObject = json.loads(text)
    return result


def set_aside(body: JSONObject, root: str | None) -> JSONObject:
    """``body`` with the attempt's directory ``root`` replaced by a mark, in both spellings."""
    return _rewrite(body, _spellings(root), ROOT_MARKS if root else ())


def moved(answer: JSONObject, reference_root: str | None, root: str | None) -> JSONObject:
    """The reference's answer with its attempt directory replaced by this host's (a streamed answer's
    path split across two events keeps the reference's: the next request then differs)."""
    if not reference_root or not root:
        return answer
    return _rewrite(answer, _spellings(reference_root), _spellings(root))


def _text(message: JSONValue) -> str:
    """A message as text for a person: its content, else its tool calls."""
    if not isinstance(message, dict):
        return _canonical(message)
    content = message.get("content")
    if isinstance(content, str) and content:
        return content
    return _canonical({k: v for k, v in message.items() if k != "role"})


class DivergenceJSON(TypedDict):
    """A divergence as ``model_hold.json`` lists it."""

    task: str
    attempt: int
    host: str
    request: int
    message: int | None
    role: str | None
    reference: str
    other: str
    diff: list[str]


class HoldSummaryJSON(TypedDict):
    """``model_hold.json`` as written."""

    mode: str
    reference: str
    recorded: dict[str, int]
    held: dict[str, dict[str, int]]
    live: dict[str, dict[str, int]]
    divergences: list[DivergenceJSON]


class RecordedExchange(TypedDict):
    """One line of ``model_record.jsonl``: the reference's request number ``request`` (from 0) of
    attempt ``attempt``, its body and the answer it got (a streamed one: its event lines)."""

    attempt: str
    request: int
    body: JSONObject
    answer: JSONObject


def recorded_exchange(row: JSONObject) -> RecordedExchange:
    """A line of ``model_record.jsonl`` read back; a field of the wrong shape reads as empty."""
    return {"attempt": str(row.get("attempt")), "request": _count_of(row.get("request")),
            "body": mapping(row.get("body")), "answer": mapping(row.get("answer"))}


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

    def to_json(self) -> DivergenceJSON:
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
    def from_json(cls, data: JSONObject) -> Divergence:
        diff, message, role = data.get("diff"), data.get("message"), data.get("role")
        return cls(
            task=str(data.get("task") or ""),
            attempt=_count_of(data.get("attempt")),
            host=str(data.get("host") or ""),
            request=_count_of(data.get("request")),
            message=message if isinstance(message, int) else None,
            role=role if isinstance(role, str) else None,
            reference=str(data.get("reference") or ""),
            other=str(data.get("other") or ""),
            diff=[str(line) for line in diff] if isinstance(diff, list) else [],
        )


def _count_of(value: JSONValue) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _counts(value: JSONValue) -> dict[str, int]:
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

    def to_json(self) -> HoldSummaryJSON:
        return {
            "mode": self.mode,
            "reference": self.reference,
            "recorded": dict(sorted(self.recorded.items())),
            "held": {h: dict(sorted(v.items())) for h, v in sorted(self.held.items())},
            "live": {h: dict(sorted(v.items())) for h, v in sorted(self.live.items())},
            "divergences": [d.to_json() for d in self.divergences],
        }

    @classmethod
    def from_json(cls, data: JSONObject) -> HoldSummary:
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
            data: JSONValue = json_loads(run_dir.model_hold_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return cls.from_json(data) if isinstance(data, dict) else None

    @classmethod
    def joined(cls, parts: list[HoldSummary]) -> HoldSummary | None:
        """One summary of several runs' whose attempts are disjoint (shards, rounds): the first one's
        mode and reference, the tables joined, the divergences listed part by part."""
        if not parts:
            return None
        merged = cls(parts[0].mode, parts[0].reference)
        for part in parts:
            merged.recorded.update(part.recorded)
            for mine, theirs in ((merged.held, part.held), (merged.live, part.live)):
                for host, counts in theirs.items():
                    mine.setdefault(host, {}).update(counts)
            merged.divergences += part.divergences
        return merged

    def write(self, path: Path, write: Callable[[Path, bytes], None]) -> None:
        write(path, (json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n").encode())

    def recorded_requests(self, keys: list[str]) -> int:
        """The reference's requests in the attempts ``keys``."""
        return sum(self.recorded.get(k, 0) for k in keys)

    def held_requests(self, host: str, keys: list[str]) -> int:
        """How many of ``host``'s model requests in the attempts ``keys`` were answered from the record."""
        mine = self.held.get(host, {})
        return sum(mine.get(k, 0) for k in keys)


def first_difference(reference: RequestView, other: RequestView) -> tuple[int | None, str | None, str, str]:
    """(message index, role, reference text, other text) of the first difference of two requests'
    comparable views (``messages``, then each setting)."""
    ref_msgs, oth_msgs = listing(reference.messages), listing(other.messages)
    for i in range(max(len(ref_msgs), len(oth_msgs))):
        r = ref_msgs[i] if i < len(ref_msgs) else None
        o = oth_msgs[i] if i < len(oth_msgs) else None
        if _canonical(r) != _canonical(o):
            role = mapping(o or r).get("role")
            return (i, role if isinstance(role, str) else None, "" if r is None else _text(r),
                    "" if o is None else _text(o))
    if _canonical(reference.messages) != _canonical(other.messages):  # not a list on one side
        return None, None, f"messages: {_canonical(reference.messages)}", f"messages: {_canonical(other.messages)}"
    for key in {**reference.settings, **other.settings}:
        ref, oth = reference.settings.get(key), other.settings.get(key)
        if _canonical(ref) != _canonical(oth):
            return None, None, f"{key}: {_canonical(ref)}", f"{key}: {_canonical(oth)}"
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
        self._record: dict[str, list[tuple[JSONObject, JSONObject]]] = {}  # key -> (request, answer)
        self._roots: dict[str, str] = {}  # key -> the reference's attempt directory (exec agents)
        self._next: dict[tuple[str, str], int] = {}  # (host, key) -> index of its next request
        self._diverged: set[tuple[str, str]] = set()
        self.held: dict[str, dict[str, int]] = {}  # host -> key -> requests answered from the record
        self.live: dict[str, dict[str, int]] = {}  # host -> key -> requests answered live
        self.divergences: list[Divergence] = []

    # -- the reference ------------------------------------------------------------------------

    def record(self, key: str, request: JSONObject, answer: JSONObject, root: str | None = None) -> None:
        """``root``: the attempt's directory on the reference (an exec agent's), set aside when compared."""
        with self._lock:
            self._record.setdefault(key, []).append((request, answer))
            if root:
                self._roots[key] = root

    # -- every other host ---------------------------------------------------------------------

    def follow(self, host: str, key: str, request: JSONObject, root: str | None = None,
               comparable: Comparable | None = None) -> JSONObject | None:
        """The recorded answer to ``host``'s next request of attempt ``key``, or None: answer it live
        (mode true) or end the attempt (``diverged(host, key)`` then says so, mode strict). ``root``:
        the attempt's directory on ``host`` (an exec agent's); ``comparable``: what of a request its
        API compares (default: OpenAI chat completions')."""
        view = comparable or OpenAIChat().comparable
        with self._lock:
            reference_root = self._roots.get(key)
            index = self._next.get((host, key), 0)
            self._next[(host, key)] = index + 1
            if (host, key) in self._diverged:
                self._count(self.live, host, key)
                return None
            recorded = self._record.get(key)
            if not recorded:  # the reference never asked the model in this attempt: nothing to hold
                self._count(self.live, host, key)
                return None
            views = [(view(set_aside(req, reference_root)), answer) for req, answer in recorded]
            mine = view(set_aside(request, root))
            if index < len(views) and _canonical(views[index][0].to_json()) == _canonical(mine.to_json()):
                self._count(self.held, host, key)
                return moved(views[index][1], reference_root, root)
            self._diverged.add((host, key))
            self._count(self.live, host, key)
            self.divergences.append(self._divergence(host, key, index, mine, views))
            return None

    def diverged(self, host: str, key: str) -> bool:
        with self._lock:
            return (host, key) in self._diverged

    def _divergence(
        self, host: str, key: str, index: int, request: RequestView, recorded: list[tuple[RequestView, JSONObject]]
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
            rows: list[RecordedExchange] = [
                {"attempt": key, "request": i, "body": req, "answer": ans}
                for key, exchanges in sorted(self._record.items())
                for i, (req, ans) in enumerate(exchanges)
            ]
        write(run_dir.model_record_path, "".join(_canonical(row) + "\n" for row in rows).encode())
        self.summary().write(run_dir.model_hold_path, write)


def merge_hold(shards: list[RunDir], target: RunDir, write: Callable[[Path, bytes], None]) -> None:
    """``target``'s held-model files from its shards' (``crosshost merge``): each shard held the model
    for its own tasks, so their attempts are disjoint and the run's record is every shard's
    exchanges, in the order a run writes them; the summary's tables are joined and the
    divergences listed shard by shard."""
    exchanges: list[tuple[str, int, str]] = []
    for shard in shards:
        for _, row in iter_jsonl(shard.model_record_path, missing_ok=True):
            exchange = recorded_exchange(row)
            exchanges.append((exchange["attempt"], exchange["request"], _canonical(exchange) + "\n"))
    write(target.model_record_path, "".join(line for _, _, line in sorted(exchanges)).encode())
    merged = HoldSummary.joined([part for part in map(HoldSummary.read, shards) if part is not None])
    if merged is not None:
        merged.write(target.model_hold_path, write)
