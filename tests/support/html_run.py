"""A known run for the report.html tests: three hosts, one flip with a shape divergence, one
value-only divergence, an agreeing task and a task whose id and arguments are hostile markup."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.rundirs import Attempt, RunSpec, build_run, fingerprint, two_hosts

HOSTILE_TASK = '<img src=x onerror="window.pwned=1">'
HOSTILE_VALUE = "</script><script>window.pwned=2</script><!--"
OBSERVATION = "active (running) [REDACTED]"
PREDICATE_OUTPUT = "curl: (7) Failed to connect to 127.0.0.1 port 80\nFAIL: nginx still unhealthy"
EXTRA_CALL = ("http_get_health", {"url": "http://127.0.0.1:9/health"})


def build_known_run(
    root: Path,
    run_id: str = "20250101T000000Z-abcdef",
    extra_attempts: dict[tuple[str, str, int], Attempt] | None = None,
    **spec: object,
) -> Path:
    """``flip-task`` passes on local (the reference) and box-c and fails on box-b, whose attempt 0
    makes an extra call at step 2; box-c calls with another value at step 1. Two attempts each."""
    hosts = two_hosts()
    hosts["box-c"] = fingerprint("box-c", "c" * 16, locale={"LANG": "POSIX", "LC_ALL": None, "resolved": "C"})
    attempts: dict[tuple[str, str, int], Attempt] = {}
    healthy = [("read_unit_status", {"unit": "nginx.service"}), ("restart_unit", {"unit": "nginx.service"})]
    for host in hosts:
        for n in (0, 1):
            attempts[(host, "agree-task", n)] = Attempt("pass")
            attempts[(host, HOSTILE_TASK, n)] = Attempt(
                "fail", calls=[("read_unit_status", {"unit": HOSTILE_VALUE})], why=HOSTILE_VALUE
            )
    attempts[("local", "flip-task", 0)] = Attempt("pass")
    attempts[("local", "flip-task", 1)] = Attempt("pass")
    attempts[("box-b", "flip-task", 0)] = Attempt(
        "fail",
        calls=[healthy[0], EXTRA_CALL, healthy[1]],
        why="predicate exit 1: nginx still unhealthy",
        predicate_output=PREDICATE_OUTPUT,
    )
    attempts[("box-b", "flip-task", 1)] = Attempt("fail", why="predicate exit 1: nginx still unhealthy")
    attempts[("box-c", "flip-task", 0)] = Attempt(
        "pass", calls=[("read_unit_status", {"unit": "nginx-alt.service"}), healthy[1]]
    )
    attempts[("box-c", "flip-task", 1)] = Attempt("pass")
    attempts.update(extra_attempts or {})
    run = build_run(root, RunSpec(hosts=hosts, attempts=attempts, **spec), run_id=run_id)  # type: ignore[arg-type]
    # the runner's observation sidecars (already redacted) for flip-task's attempt 0
    for host, n_calls in (("local", 2), ("box-b", 3), ("box-c", 2)):
        lines = [
            json.dumps({"type": "obs", "step": s, "tool": "t", "content": f"{host} says {OBSERVATION} {s}"})
            for s in range(1, n_calls + 1)
        ]
        (run / "hosts" / host / "traces" / "flip-task.0.obs.jsonl").write_text("\n".join(lines) + "\n")
    return run
