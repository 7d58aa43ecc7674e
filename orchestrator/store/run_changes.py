"""What changed between two runs of the same suite: tasks that newly flip or stopped flipping, pins
that moved, hosts and tasks that came or went, and which fingerprint fields changed."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from agent_runner.records import Fingerprint
from orchestrator.analysis.attribution import fingerprint_differences
from orchestrator.dotted import flatten
from orchestrator.store.run_row import RunRow
from orchestrator.store.rundir import RunDir


class PinMove(TypedDict):
    pin: str  # dotted: ``t1.prompt_sha``, or ``suite_sha``
    old: Any  # a pin's value: whatever JSON the trace header held
    new: Any


class FieldChange(TypedDict):
    """One fingerprint field that changed: a list field as what came and went, any other as old/new."""

    field: str  # dotted: ``locale.LANG``
    added: NotRequired[list[str]]
    removed: NotRequired[list[str]]
    old: NotRequired[Any]  # a fingerprint value: whatever JSON the host wrote
    new: NotRequired[Any]


class FingerprintChange(TypedDict):
    host: str
    old: str | None
    new: str | None
    python_old: str | None
    python_new: str | None
    fields: NotRequired[list[FieldChange]]  # when both runs' fingerprint.json could be read


class ChangesJson(TypedDict):
    """``Changes`` as ``history --json`` prints it."""

    previous: str
    current: str
    newly_flipping: list[str]
    stopped_flipping: list[str]
    pins_moved: list[PinMove]
    hosts_added: list[str]
    hosts_removed: list[str]
    tasks_added: list[str]
    tasks_removed: list[str]
    repeat: dict[str, int | None] | None
    fingerprints_changed: list[FingerprintChange]


@dataclass
class Changes:
    """What moved between two runs of the same suite."""

    previous: str
    current: str
    newly_flipping: list[str]
    stopped_flipping: list[str]
    pins_moved: list[PinMove]
    # what makes the two runs not the same measurement: compare them knowing it
    hosts_added: list[str] = field(default_factory=list)
    hosts_removed: list[str] = field(default_factory=list)
    tasks_added: list[str] = field(default_factory=list)
    tasks_removed: list[str] = field(default_factory=list)
    repeat: dict[str, int | None] | None = None  # {"old": n, "new": m} when they differ
    # hosts in both runs whose fingerprint changed
    fingerprints_changed: list[FingerprintChange] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (
            self.newly_flipping or self.stopped_flipping or self.pins_moved or self.hosts_added
            or self.hosts_removed or self.tasks_added or self.tasks_removed or self.repeat
            or self.fingerprints_changed
        )  # fmt: skip

    def to_json(self) -> ChangesJson:
        return ChangesJson(
            previous=self.previous, current=self.current, newly_flipping=self.newly_flipping,
            stopped_flipping=self.stopped_flipping, pins_moved=self.pins_moved, hosts_added=self.hosts_added,
            hosts_removed=self.hosts_removed, tasks_added=self.tasks_added, tasks_removed=self.tasks_removed,
            repeat=self.repeat, fingerprints_changed=self.fingerprints_changed,
        )  # fmt: skip


def _fingerprint(run_dir: Path, host: str) -> Fingerprint | None:
    """The host's fingerprint.json in that run; None when it was removed or never written (the
    digests still say it changed)."""
    return RunDir(run_dir).read_fingerprint(host)[0]


def _finding(f: Any) -> str:
    return f"{f.get('detail') or f.get('kind')} ({f.get('action')})" if isinstance(f, dict) else str(f)


def fingerprint_fields(old: Fingerprint, new: Fingerprint) -> list[FieldChange]:
    """What changed between two fingerprints of one host, as a user reads it: the isolation findings
    and environment keys that came or went, then every other field that differs."""
    out: list[FieldChange] = []
    for name, show in (("findings", _finding), ("env_keys", str)):
        before = {show(x) for x in getattr(old, name) or []}
        after = {show(x) for x in getattr(new, name) or []}
        if before != after:
            out.append(FieldChange(field=name, added=sorted(after - before), removed=sorted(before - after)))
    out += [
        FieldChange(field=key, old=a, new=b)
        for key, a, b in fingerprint_differences(old, new)
        if key.split(".", 1)[0] not in ("findings", "env_keys")
    ]
    return out


def changes(prev: RunRow, cur: RunRow, runs_dir: Path | None = None) -> Changes:
    """Tasks that newly flip, tasks that stopped flipping, and pins that moved, from prev to cur;
    with ``runs_dir``, also which fingerprint fields changed (from the run dirs' fingerprint.json).

    Only tasks both runs replayed are compared: a `--tasks` subset run says nothing about the tasks it
    left out (they neither "stopped flipping" nor had their pins "moved")."""
    both = prev.tasks.keys() & cur.tasks.keys()
    left_out = (prev.tasks.keys() | cur.tasks.keys()) - both
    old_pins, new_pins = flatten(prev.pins), flatten(cur.pins)
    moved = [
        PinMove(pin=k, old=old_pins.get(k), new=new_pins.get(k))
        for k in sorted(old_pins.keys() | new_pins.keys())
        if old_pins.get(k) != new_pins.get(k) and k.split(".", 1)[0] not in left_out
    ]
    if prev.suite_sha != cur.suite_sha:
        moved.insert(0, PinMove(pin="suite_sha", old=prev.suite_sha, new=cur.suite_sha))
    old_hosts = {str(h.get("name")): h for h in prev.hosts}
    new_hosts = {str(h.get("name")): h for h in cur.hosts}
    fingerprints = [
        FingerprintChange(
            host=name, old=old_hosts[name].get("fingerprint"), new=h.get("fingerprint"),
            python_old=old_hosts[name].get("python"), python_new=h.get("python"),
        )  # fmt: skip
        for name, h in new_hosts.items()
        if name in old_hosts
        and old_hosts[name].get("fingerprint") and h.get("fingerprint")
        and old_hosts[name].get("fingerprint") != h.get("fingerprint")
    ]
    for f in fingerprints:
        if runs_dir is None:
            break
        before, after = (_fingerprint(runs_dir / r.run_id, f["host"]) for r in (prev, cur))
        if before is not None and after is not None:
            f["fields"] = fingerprint_fields(before, after)
    repeat_moved = prev.repeat is not None and cur.repeat is not None and prev.repeat != cur.repeat
    return Changes(
        previous=prev.run_id,
        current=cur.run_id,
        newly_flipping=sorted((cur.flipping - prev.flipping) & both),
        stopped_flipping=sorted((prev.flipping - cur.flipping) & both),
        pins_moved=moved,
        hosts_added=[h for h in new_hosts if h not in old_hosts],
        hosts_removed=[h for h in old_hosts if h not in new_hosts],
        tasks_added=sorted(cur.tasks.keys() - prev.tasks.keys()),
        tasks_removed=sorted(prev.tasks.keys() - cur.tasks.keys()),
        repeat={"old": prev.repeat, "new": cur.repeat} if repeat_moved else None,
        fingerprints_changed=fingerprints,
    )
