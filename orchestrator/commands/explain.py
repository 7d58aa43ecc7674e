"""``crosshost explain RUN_DIR``: why each flipped task flipped, by running it again.

For the run's flipped tasks, explain replays them once more with the run's pins (the suite the run
recorded, checked by its sha) on the reference and every host they flipped on, then re-runs them on
the reference with one environment fact of another host applied at a time (a counterfactual: each
allowlisted variable whose value differs between the two fingerprints, the locale variables, TZ,
and PATH as the once-more replay's attempts saw it), at most ``MAX_COUNTERFACTUALS`` replays. A fact
whose change alone gives the reference the other host's verdict is named. The once-more replay runs
each attempt's processes (the agent's tree, its tool processes, the predicate) under strace where
the host has it; every path they touched outside the attempt's own directories is then checked on
every compared host (read only) and the paths whose state differs are named. Every replay is an
ordinary replay of kind ``explain`` under ``<run>/explain/``, so each host's workspace is removed and
verified gone as after any replay.
The evidence goes to ``explain.json``; the run's reports are written again to carry it.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from agent_runner.errors import TraceError
from agent_runner.filetrace import MAX_PATHS, library_path
from agent_runner.records import EvidenceCut, FileEvidence, Fingerprint
from orchestrator.analysis import analyse_run
from orchestrator.analysis.models import (
    Counterfactual,
    ExplainRecord,
    ExplainTask,
    PathEvidence,
    RunReport,
    TaskReport,
)
from orchestrator.errors import InputError
from orchestrator.exit_policy import explain_exit
from orchestrator.hosts.bundle import build_bundle, bundle_cache_dir
from orchestrator.hosts.host_job import EventSink
from orchestrator.hosts.inventory import HostConfig, load_inventory
from orchestrator.hosts.transport import Opener, default_opener
from orchestrator.report import analyse_and_write
from orchestrator.store.rundir import RunDir, load_run, write_json_atomic

#: counterfactual replays per explain (each is one replay of the flipped tasks on the reference)
MAX_COUNTERFACTUALS = 8
COUNTERFACTUALS_AT_ONCE = 4
#: fingerprint fields that are environment variables the runner passes (when allowlisted)
_ENV_FACTS = ("locale.LANG", "locale.LC_ALL", "locale.LC_CTYPE", "locale.LC_MESSAGES", "tz.TZ")


@dataclass
class ExplainRequest:
    run_dir: Path
    inventory_path: Path = Path("hosts.toml")
    tasks: list[str] | None = None  # the flipped tasks to explain (default: every one)
    accept_new: bool = False
    cache_dir: Path | None = None


@dataclass
class ExplainOutcome:
    run_dir: Path
    record: ExplainRecord
    report: RunReport | None = None
    errors: dict[str, str] = field(default_factory=dict)
    exit_code: int = 0


@dataclass(frozen=True)
class EnvFact:
    host: str  # the host whose value it is
    name: str  # the variable
    value: str | None  # None: unset on that host


def env_facts(
    reference: Fingerprint | None, other: Fingerprint | None, host: str, allowlist: Collection[str]
) -> list[EnvFact]:
    """The environment variables whose value differs between the two fingerprints, as facts of ``host``:
    the locale variables and TZ with their values, then an allowlisted variable present on the
    reference only (unset on ``host``; ``allowlist`` is the reference's: what its runs can see). A variable set on ``host`` alone has no recorded value (the
    fingerprint keeps names only): it is not a fact explain can apply."""
    left = reference.to_json() if reference else {}
    right = other.to_json() if other else {}
    facts: list[EnvFact] = []
    for dotted in _ENV_FACTS:
        group, name = dotted.split(".")
        a, b = (left.get(group) or {}).get(name), (right.get(group) or {}).get(name)
        if a != b and (b is None or isinstance(b, str)):
            facts.append(EnvFact(host, name, b))
    # an attempt always has a PATH (the runner's default when the host has none): its value is path_fact's
    known = {f.name for f in facts} | {d.split(".")[1] for d in _ENV_FACTS} | {"PATH"}
    ref_keys, other_keys = set(left.get("env_keys") or []), set(right.get("env_keys") or [])
    facts += [
        EnvFact(host, k, None) for k in sorted(ref_keys - other_keys) if k not in known and k in allowlist
    ]
    return facts


def path_fact(env_paths: dict[str, str], reference: str, host: str) -> list[EnvFact]:
    """``host``'s PATH as a fact when it differs from the reference's: both as the attempts of explain's
    once-more run saw them (the fingerprint keeps no value of PATH). Applied on the reference as it is,
    directories the reference lacks included: a lookup there finds nothing, as on a host without them."""
    ours, theirs = env_paths.get(reference), env_paths.get(host)
    if ours is None or theirs is None or ours == theirs:
        return []
    return [EnvFact(host, "PATH", theirs)]


def with_fact(fact: EnvFact) -> Callable[[HostConfig], HostConfig]:
    """The inventory entry with ``fact`` applied: the variable pinned to the value, or left out."""

    def adjust(cfg: HostConfig) -> HostConfig:
        allow = [k for k in cfg.env_allowlist if k != fact.name]
        env = {k: v for k, v in cfg.env.items() if k != fact.name}
        if fact.value is not None:
            allow.append(fact.name)
            env[fact.name] = fact.value
        return cfg.model_copy(update={"env_allowlist": allow, "env": env})

    return adjust


def _usual(verdicts: list[str]) -> str | None:
    """A host's verdict on a task: its most common non-error one."""
    counts = Counter(v for v in verdicts if v != "error")
    return counts.most_common(1)[0][0] if counts else None


def _flipped(report: RunReport, wanted: list[str] | None, where: str) -> list[TaskReport]:
    flipped = [t for t in report.tasks if t.flip]
    if wanted:
        names = {t.task for t in report.tasks}
        for name in wanted:
            if name not in names:
                raise InputError(f"{where}: --task {name!r} is not a task of this run")
        flipped = [t for t in flipped if t.task in wanted]
    return flipped


def explain(
    request: ExplainRequest, *, opener: Opener | None = None, on_event: EventSink | None = None
) -> ExplainOutcome:
    """Replay the flipped tasks once more and the counterfactuals; write explain.json and the reports."""
    from orchestrator.commands.replay import ReplayRequest, replay

    started = time.monotonic()
    run = load_run(request.run_dir)
    report = analyse_run(request.run_dir)
    reference = report.reference or (run.hosts[0] if run.hosts else "")
    record = ExplainRecord(run_id=run.run_id, reference=reference, max_counterfactuals=MAX_COUNTERFACTUALS)
    outcome = ExplainOutcome(request.run_dir, record)
    tasks = _flipped(report, request.tasks, str(request.run_dir))
    if not tasks:
        outcome.report = report
        return outcome
    suite = run.manifest.suite
    if suite is None or not suite.path or not Path(suite.path).is_dir():
        raise InputError(
            f"{request.run_dir}: the run's suite is not on this machine ({suite.path if suite else '?'})"
        )
    suite_path = Path(suite.path)
    bundle = build_bundle(suite_path, request.cache_dir or bundle_cache_dir(run.path.parent))
    if suite.sha and bundle.suite_sha != suite.sha:
        raise InputError(
            f"{suite.path}: the suite changed since run {run.run_id} (sha {bundle.suite_sha}, the run's {suite.sha}); "
            "explain replays with the run's pins only"
        )
    out = RunDir(request.run_dir).explain_runs
    lock = threading.Lock()
    runs: dict[str, Path] = {}

    def run_once(
        hosts: list[str],
        names: list[str],
        adjust: Callable[[HostConfig], HostConfig] | None,
        files: bool = False,
    ) -> dict[tuple[str, str], str]:
        replayed = replay(
            ReplayRequest(
                suite_dir=suite_path,
                inventory_path=request.inventory_path,
                hosts=hosts,
                tasks=names,
                repeat=1,
                out=out,
                accept_new=request.accept_new,
                kind="explain",
                reference=hosts[0],
                adjust_host=adjust,
                hold_model=False,
                trace_files=files,
            ),
            opener=opener,
            on_event=on_event,
            bundle=bundle,
            with_analysis=False,
        )
        with lock:  # counterfactual replays finish side by side
            record.replays += 1
            record.runs.append(replayed.run_dir.run_id)
            runs[replayed.run_dir.run_id] = replayed.run_dir.path
            outcome.errors.update(replayed.errors)
        return {(r.env, r.task): r.verdict for r in replayed.results}

    others = sorted({h for t in tasks for h in t.flipped_hosts})
    again = run_once([reference, *others], [t.task for t in tasks], None, files=True)
    configs = {h.name: h for h in load_inventory(request.inventory_path).hosts}
    paths, notes, env_paths = file_evidence(
        runs[record.runs[0]], [reference, *others], [t.task for t in tasks], configs,
        opener or default_opener, request.accept_new,
    )  # fmt: skip
    entries = {t.task: ExplainTask(task=t.task) for t in tasks}
    for t in tasks:
        entries[t.task].again = {h: again.get((h, t.task)) for h in [reference, *t.flipped_hosts]}
        entries[t.task].paths = paths[t.task]
        entries[t.task].not_collected += notes[t.task]

    allowlist = configs[reference].env_allowlist
    planned: list[tuple[EnvFact, list[str]]] = []
    for host in others:
        names = [t.task for t in tasks if host in t.flipped_hosts]
        facts = env_facts(run.fingerprints.get(reference), run.fingerprints.get(host), host, allowlist)
        for fact in path_fact(env_paths, reference, host) + facts:
            if len(planned) < MAX_COUNTERFACTUALS:
                planned.append((fact, names))
            else:
                record.skipped.append(
                    f"{host}'s {fact.name}: over the bound of {MAX_COUNTERFACTUALS} re-runs"
                )
    # each counterfactual is its own replay of the reference (its own workspace): they run side by side
    with ThreadPoolExecutor(max_workers=COUNTERFACTUALS_AT_ONCE) as pool:
        results = list(pool.map(lambda p: run_once([reference], p[1], with_fact(p[0])), planned))
    for (fact, names), verdicts in zip(planned, results, strict=True):
        for t in tasks:
            if t.task not in names:
                continue
            theirs = _usual(t.verdicts.get(fact.host, []))
            ours = _usual(t.verdicts.get(reference, []))
            got = verdicts.get((reference, t.task))
            entries[t.task].counterfactuals.append(
                Counterfactual(
                    host=fact.host,
                    fact=fact.name,
                    value=fact.value,
                    verdict=got,
                    reproduces=got is not None and got == theirs and got != ours,
                )  # fmt: skip
            )
    record.tasks = list(entries.values())
    record.seconds = round(time.monotonic() - started, 2)
    write_json_atomic(RunDir(request.run_dir).explain_path, record.model_dump(mode="json"))
    outcome.report = analyse_and_write(request.run_dir, None)
    outcome.exit_code = explain_exit(outcome.errors)
    return outcome


# --- file evidence ----------------------------------------------------------------------------------

MAX_CHECKED_PATHS = 3000  # paths checked per host (the union over the explained tasks)
CHUNK_CHARS = 60_000  # paths per exec of the check: its one argument stays far under the kernel's 128 KiB
SMALL_FILE = 1024 * 1024  # files up to this size get a sha256
# Run on each host with the host's python: per path its state in one word or line; stdlib only. A file
# others may not read gets no digest: a hash of a small private file (a key, a token) is a lead to it.
_STAT_SCRIPT = r"""
import hashlib, json, os, stat, sys
out, canonical = {}, {}
for p in json.loads(sys.stdin.read() if len(sys.argv) < 2 else sys.argv[1]):
    # the file this path names through its directories' links (usr-merge: /bin/jq is /usr/bin/jq)
    canonical[p] = os.path.join(os.path.realpath(os.path.dirname(p)), os.path.basename(p))
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        out[p] = "absent"; continue
    except OSError as e:
        out[p] = "unreadable (%s)" % (e.strerror or e); continue
    if stat.S_ISLNK(st.st_mode):
        out[p] = "symlink -> %s" % os.readlink(p)
    elif stat.S_ISDIR(st.st_mode):
        try:
            out[p] = "directory of %d entries" % len(os.listdir(p))
        except OSError:
            out[p] = "directory"
    elif stat.S_ISREG(st.st_mode):
        s = "file %d bytes" % st.st_size
        if not st.st_mode & stat.S_IROTH:
            s += ", not world-readable (no digest)"
        elif st.st_size <= %(small)d:
            try:
                with open(p, "rb") as f:
                    s += " sha256 " + hashlib.sha256(f.read()).hexdigest()[:16]
            except OSError:
                pass
        out[p] = s
    elif stat.S_ISCHR(st.st_mode):
        out[p] = "character device"
    elif stat.S_ISBLK(st.st_mode):
        out[p] = "block device"
    elif stat.S_ISFIFO(st.st_mode):
        out[p] = "fifo"
    else:
        out[p] = "socket"
print(json.dumps({"states": out, "canonical": canonical}))
""".replace("%(small)d", str(SMALL_FILE))


SIDES = ("predicate", "agent")  # who touched a path, in the record's keys "paths" and "agent_paths"


@dataclass
class Touched:
    """One host's file evidence for one task of explain's once-more run."""

    #: path -> side -> the system calls that named it; None when the host collected none
    paths: dict[str, dict[str, list[str]]] | None
    why: str = ""  # why not, when ``paths`` is None
    env_path: str | None = None  # the attempt's PATH there (None: not sent, or withheld as secret-looking)
    #: what the host dropped past its cap, per side: how many, and under which directories
    cut: dict[str, EvidenceCut] = field(default_factory=dict)


def touched(run_dir: Path, host: str, task: str) -> Touched:
    """The paths ``host``'s attempt (predicate, agent and its tools) touched in explain's once-more run."""
    path = RunDir(run_dir).host_dir(host) / "files" / f"{task}.0.json"
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return Touched(None, "the host sent no file evidence")
    try:
        evidence = FileEvidence.from_json(record, str(path))
    except TraceError:
        return Touched(None, "the host's file evidence is damaged")
    if not evidence.traced:
        return Touched(None, evidence.why, evidence.env_path)
    found: dict[str, dict[str, list[str]]] = {}
    for side, table in zip(SIDES, (evidence.paths, evidence.agent_paths), strict=True):
        for k, calls in table.items():
            found.setdefault(k, {})[side] = calls
    return Touched(found, "", evidence.env_path, evidence.cut)


def _cut_note(host: str, side: str, cut: EvidenceCut) -> str:
    """How much of a side's file evidence a host dropped, and where (its largest directories first)."""
    where = ", ".join(f"{d} ({n})" for d, n in sorted(cut.under.items(), key=lambda i: (-i[1], i[0]))[:5])
    return (f"file evidence cut on {host}: the {side}'s {cut.dropped} touched path(s) past the first "
            f"{MAX_PATHS} not kept, library paths first" + (f" (under {where})" if where else ""))


def _chunks(paths: list[str]) -> list[list[str]]:
    """``paths`` in runs whose JSON stays under ``CHUNK_CHARS`` (one argument of one exec)."""
    chunks: list[list[str]] = [[]]
    size = 0
    for p in paths:
        if chunks[-1] and size + len(p) + 4 > CHUNK_CHARS:
            chunks.append([])
            size = 0
        chunks[-1].append(p)
        size += len(json.dumps(p)) + 2
    return [c for c in chunks if c]


@dataclass
class PathFacts:
    """What a host's stat script said: each path's state, and the file each names through its
    directories' links (a path missing from ``canonical`` names itself)."""

    states: dict[str, str]
    canonical: dict[str, str]


def path_facts(cfg: HostConfig, paths: list[str], opener: Opener, accept_new: bool) -> PathFacts:
    """Each path's state on the host, by one exec of its python per chunk (nothing is written there)."""
    host = opener(cfg, accept_new=accept_new)
    facts = PathFacts({}, {})
    try:
        for chunk in _chunks(paths):
            result = host.exec([cfg.python, "-c", _STAT_SCRIPT, json.dumps(chunk)], 60)
            try:
                got = json.loads(result.stdout)
            except ValueError:
                continue
            if not isinstance(got, dict):
                continue
            for key, into in (("states", facts.states), ("canonical", facts.canonical)):
                part = got.get(key)
                if isinstance(part, dict):
                    into.update({str(k): str(v) for k, v in part.items() if str(k) in chunk})
    finally:
        host.close()
    return facts


def path_states(cfg: HostConfig, paths: list[str], opener: Opener, accept_new: bool) -> dict[str, str]:
    """Each path's state on the host (``path_facts`` without the links)."""
    return path_facts(cfg, paths, opener, accept_new).states


def _one_file(paths: list[str], facts: dict[str, PathFacts], hosts: list[str]) -> dict[str, list[str]]:
    """Spellings of one file through a directory link on every host, grouped: the file's own path
    (when one of them is it, else the first) -> the other spellings."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for p in paths:
        key = tuple(facts[h].canonical.get(p, p) if h in facts else p for h in hosts)
        groups.setdefault(key, []).append(p)
    out: dict[str, list[str]] = {}
    for key, spellings in groups.items():
        own = next((p for p in spellings if all(k == p for k in key)), spellings[0])
        out[own] = [p for p in spellings if p != own]
    return out


def _ranked(found: list[PathEvidence], hosts: list[str]) -> list[PathEvidence]:
    """The likeliest cause first. A path is *anchored* when it was looked up on every host with a
    different answer (the same lookup), or lies under such a path (an entry of a directory only one
    host has); a path touched on one host only, outside those, follows from a difference earlier
    (another interpreter and its files). Then: the most specific first (a differing path inside
    another comes before it), present on one host and absent on another, the predicate's first."""
    every = [e.path for e in found if set(e.touched_on) == set(hosts)]

    def under(path: str, parents: list[str]) -> bool:
        return any(path.startswith(p.rstrip("/") + "/") for p in parents)

    def key(e: PathEvidence) -> tuple[bool, bool, bool, bool, bool, str]:
        states = set(e.state.values())
        return (
            library_path(e.path),  # an interpreter's or library's own file: what the agent's start reads
            e.path not in every and not under(e.path, every),
            any(under(o.path, [e.path]) for o in found),
            "absent" not in states or states == {"absent"},
            "predicate" not in e.by,
            e.path,
        )

    return sorted(found, key=key)


def file_evidence(
    explain_run: Path,
    hosts: list[str],
    tasks: list[str],
    configs: dict[str, HostConfig],
    opener: Opener,
    accept_new: bool,
) -> tuple[dict[str, list[PathEvidence]], dict[str, list[str]], dict[str, str]]:
    """Per task the touched paths whose state differs between ``hosts``, what was not collected, and
    each host's attempt PATH (where one was sent)."""
    notes: dict[str, list[str]] = {t: [] for t in tasks}
    env_paths: dict[str, str] = {}
    seen: dict[str, dict[str, dict[str, dict[str, list[str]]]]] = {t: {} for t in tasks}  # task -> host -> path
    for task in tasks:
        for host in hosts:
            got = touched(explain_run, host, task)
            if got.env_path is not None:
                env_paths.setdefault(host, got.env_path)
            if got.paths is None:
                notes[task].append(f"file evidence not collected on {host}: {got.why}")
            else:
                seen[task][host] = got.paths
            notes[task] += [_cut_note(host, side, c) for side, c in sorted(got.cut.items()) if c.dropped]
    touched_all = sorted({p for per_host in seen.values() for paths in per_host.values() for p in paths},
                         key=lambda p: (library_path(p), p))
    wanted = sorted(touched_all[:MAX_CHECKED_PATHS])
    if len(touched_all) > len(wanted):
        unchecked = touched_all[len(wanted):]
        for task in tasks:
            notes[task].append(f"file evidence cut: {len(unchecked)} of {len(touched_all)} touched path(s) not "
                               f"compared between hosts (library paths first; e.g. {unchecked[0]})")
    facts = {h: path_facts(configs[h], wanted, opener, accept_new) for h in hosts} if wanted else {}
    found: dict[str, list[PathEvidence]] = {t: [] for t in tasks}
    for task in tasks:
        task_paths = sorted({p for per_host in seen[task].values() for p in per_host if p in wanted})
        for p, aliases in _one_file(task_paths, facts, hosts).items():
            state = {h: facts[h].states.get(p, "unknown") if h in facts else "unknown" for h in hosts}
            if len(set(state.values())) > 1:
                spellings = [p, *aliases]
                sides = [per_host[q] for per_host in seen[task].values() for q in spellings if q in per_host]
                calls = sorted({c for by_side in sides for cs in by_side.values() for c in cs})
                by = [side for side in SIDES if any(side in by_side for by_side in sides)]
                on = [h for h in hosts if any(q in seen[task].get(h, {}) for q in spellings)]
                found[task].append(
                    PathEvidence(path=p, aliases=aliases, calls=calls, touched_on=on, state=state, by=by)
                )
        found[task] = _ranked(found[task], hosts)
    return found, notes, env_paths
