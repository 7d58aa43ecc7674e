"""Seeded simulations of the suite-wide rule (docs/statistics.md): error rates, power and the
attempts ``--until-decided`` spends.

Every task of a simulated run is the same decision crosshost makes on a real one: per task
``flips.task_flip``, across the suite ``flips.correct_flips`` (Holm or Benjamini–Hochberg at alpha),
then ``verdict.classify_task``; ``--until-decided`` rounds follow ``sequential.plan_looks`` and
``sequential.still_open``. A host-independent agent passes every task at one rate on every host, so
any ``host_coupling`` or ``laptop_contamination`` is false.

``python -m bench.stats_bench [--runs N] [--seed S]`` prints the numbers as JSON; ``make bench``
runs it with the defaults and keeps them in its results.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.analysis.flips import TaskFlip, correct_flips, task_flip
from orchestrator.analysis.sequential import look_level, plan_looks, still_open
from orchestrator.analysis.stats import BH, HOLM
from orchestrator.analysis.verdict import classify_task

HOSTS = ("local", "box-a", "box-b")
REFERENCE = HOSTS[0]
OTHERS = list(HOSTS[1:])
FINGERPRINTS: dict[str, str | None] = {h: f"fp-{h}" for h in HOSTS}
ALPHA = 0.05
DIFFERS = ("host_coupling", "laptop_contamination")

#: a task's pass rate on each host
Rates = dict[str, float]


@dataclass
class Outcome:
    """One simulated run: the classification of every task and the attempts spent."""

    classifications: list[str]
    attempts: int


def _draw(rng: random.Random, rate: float, n: int) -> list[str]:
    return ["pass" if rng.random() < rate else "fail" for _ in range(n)]


def _decide(verdicts: list[dict[str, list[str]]], level: float, correction: str) -> tuple[dict[str, TaskFlip], list[str]]:
    flips = {str(i): task_flip(v, REFERENCE, alpha=level, sampled=True) for i, v in enumerate(verdicts)}
    correct_flips(flips, {t: OTHERS for t in flips}, REFERENCE, alpha=level, correction=correction)
    classes = [
        classify_task(v, REFERENCE, FINGERPRINTS, {}, flips[str(i)], alpha=level, sampled=True).classification
        for i, v in enumerate(verdicts)
    ]
    return flips, classes


def fixed_run(rng: random.Random, suite: Sequence[Rates], repeat: int, correction: str, alpha: float = ALPHA) -> Outcome:
    """``replay --repeat N``: N attempts of every task on every host."""
    verdicts = [{h: _draw(rng, rates[h], repeat) for h in HOSTS} for rates in suite]
    _, classes = _decide(verdicts, alpha, correction)
    return Outcome(classes, repeat * len(HOSTS) * len(suite))


def sequential_run(
    rng: random.Random, suite: Sequence[Rates], start: int, max_repeat: int, correction: str, alpha: float = ALPHA
) -> Outcome:
    """``replay --until-decided --max-repeat M``: rounds of attempts for the tasks still open."""
    looks = plan_looks(start, max_repeat)
    level = look_level(alpha, len(looks))
    verdicts: list[dict[str, list[str]]] = [{h: [] for h in HOSTS} for _ in suite]
    open_tasks = list(range(len(suite)))
    attempts = 0
    classes: list[str] = []
    for target in looks:
        for i in open_tasks:
            for h in HOSTS:
                more = target - len(verdicts[i][h])
                verdicts[i][h] += _draw(rng, suite[i][h], more)
                attempts += more
        flips, classes = _decide(verdicts, level, correction)
        open_tasks = [i for i in open_tasks if still_open(flips[str(i)], REFERENCE, OTHERS, level, max_repeat)]
        if not open_tasks:
            break
    return Outcome(classes, attempts)


def quiet_suite(rng: random.Random, tasks: int = 200, low: float = 0.1, high: float = 0.9) -> list[Rates]:
    """A host-independent agent: each task one pass rate in [low, high], the same on every host."""
    out = []
    for _ in range(tasks):
        rate = rng.uniform(low, high)
        out.append({h: rate for h in HOSTS})
    return out


def with_effects(suite: list[Rates], effects: int = 5, ref_rate: float = 0.9, host_rate: float = 0.1) -> list[Rates]:
    """The first ``effects`` tasks pass at ``ref_rate`` on the reference and ``host_rate`` on box-b."""
    out = [dict(r) for r in suite]
    for i in range(effects):
        out[i] = {REFERENCE: ref_rate, "box-a": ref_rate, "box-b": host_rate}
    return out


def mostly_decided_suite(rng: random.Random, tasks: int = 200, effects: int = 5) -> list[Rates]:
    """90% of tasks all-pass or all-fail everywhere, ``effects`` tasks with a 90/10 host effect, the
    rest host-independent at 0.1-0.9."""
    constant = tasks * 9 // 10
    suite: list[Rates] = [{h: float(i % 2) for h in HOSTS} for i in range(constant)]
    suite += quiet_suite(rng, tasks - constant)
    return with_effects(suite[::-1], effects)  # the effects replace varying tasks, not constant ones


def error_rates(runs: int, seed: int, repeat: int = 8) -> dict[str, Any]:
    """Per correction: the share of quiet runs with any false host difference (FWER), and with five
    real 90/10 effects the mean false discovery proportion and the power."""
    out: dict[str, Any] = {}
    for correction in (HOLM, BH):
        rng = random.Random(seed)
        any_false = 0
        fdp_sum = 0.0
        found = 0
        for _ in range(runs):
            quiet = fixed_run(rng, quiet_suite(rng), repeat, correction)
            any_false += any(c in DIFFERS for c in quiet.classifications)
            mixed = fixed_run(rng, with_effects(quiet_suite(rng)), repeat, correction)
            declared = [i for i, c in enumerate(mixed.classifications) if c in DIFFERS]
            false = [i for i in declared if i >= 5]
            fdp_sum += len(false) / len(declared) if declared else 0.0
            found += sum(mixed.classifications[i] == "host_coupling" for i in range(5))
        out[correction] = {
            "runs": runs,
            "repeat": repeat,
            "any_false_rate": round(any_false / runs, 4),
            "mean_fdp_with_effects": round(fdp_sum / runs, 4),
            "power_90_10": round(found / (5 * runs), 4),
        }
    return out


def until_decided_against_fixed(
    runs: int, seed: int, repeat: int = 16, start: int = 2, max_repeat: int = 32, correction: str = BH
) -> dict[str, Any]:
    """On a suite of mostly decided tasks: the power and attempts of a fixed ``--repeat`` against
    ``--until-decided``."""
    result: dict[str, Any] = {"runs": runs, "correction": correction}
    for name, run in (
        (f"fixed_repeat_{repeat}", lambda rng, s: fixed_run(rng, s, repeat, correction)),
        (f"until_decided_max_{max_repeat}", lambda rng, s: sequential_run(rng, s, start, max_repeat, correction)),
    ):
        rng = random.Random(seed)
        found = attempts = false = 0
        for _ in range(runs):
            suite = mostly_decided_suite(rng)
            outcome = run(rng, suite)
            effects = [i for i, r in enumerate(suite) if r[REFERENCE] != r["box-b"]]
            found += sum(outcome.classifications[i] == "host_coupling" for i in effects)
            false += sum(c in DIFFERS for i, c in enumerate(outcome.classifications) if i not in effects)
            attempts += outcome.attempts
        result[name] = {
            "power_90_10": round(found / (5 * runs), 4),
            "attempts_per_run": round(attempts / runs),
            "false_per_run": round(false / runs, 4),
        }
    fixed, seq = (result[k] for k in (f"fixed_repeat_{repeat}", f"until_decided_max_{max_repeat}"))
    result["attempt_ratio"] = round(fixed["attempts_per_run"] / seq["attempts_per_run"], 2)
    return result


def measure(runs: int = 400, seed: int = 25) -> dict[str, Any]:
    started = time.monotonic()
    out = {
        "suite": "200 tasks, 3 hosts, host-independent pass rates 0.1-0.9, alpha 0.05",
        "error_rates_repeat_8": error_rates(runs, seed, repeat=8),
        "error_rates_repeat_16": error_rates(runs // 4, seed, repeat=16),
        "until_decided": until_decided_against_fixed(runs // 2, seed),
    }
    out["seconds"] = round(time.monotonic() - started, 1)
    return out


def markdown(stats: dict[str, Any] | None) -> list[str]:
    """The numbers as make bench's Markdown table (nothing when the simulations were skipped)."""
    if not stats:
        return []
    lines = [
        "",
        f"| statistics ({stats['suite']}) | correction | runs | any false host_coupling | mean FDP, 5 real effects | power 90/10 |",
        "|---|---|---|---|---|---|",
    ]
    for key in ("error_rates_repeat_8", "error_rates_repeat_16"):
        for correction, row in stats[key].items():
            lines.append(
                f"| --repeat {row['repeat']} | {correction} | {row['runs']} | {row['any_false_rate']} "
                f"| {row['mean_fdp_with_effects']} | {row['power_90_10']} |"
            )
    u = stats["until_decided"]
    lines += ["", "| 90% of tasks all-pass or all-fail | power 90/10 | attempts per run | false per run |", "|---|---|---|---|"]
    for name, row in u.items():
        if isinstance(row, dict):
            lines.append(f"| {name} | {row['power_90_10']} | {row['attempts_per_run']} | {row['false_per_run']} |")
    lines.append(f"| attempt ratio | | {u['attempt_ratio']}x | |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--seed", type=int, default=25)
    args = parser.parse_args(argv)
    json.dump(measure(args.runs, args.seed), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
