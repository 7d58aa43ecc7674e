"""The limit and naive baselines against real sshd hosts (the conftest fleet)."""

from pathlib import Path
from typing import Any

import pytest

from bench.baselines import BaselineError, BenchHost, run_limit, run_naive
from bench.gen_suite import generate_suite

pytestmark = pytest.mark.sshd


def _hosts(sshd_hosts: Any) -> list[BenchHost]:
    fleet = sshd_hosts.fleet
    return [BenchHost(n, "127.0.0.1", sshd_hosts.port(n), "root", fleet.identity, fleet.known_hosts)
            for n in sshd_hosts.names]


def test_limit_runs_every_predicate_on_every_host(sshd_hosts: Any, tmp_path: Path) -> None:
    suite = generate_suite(tmp_path / "s", tasks=4, sleep_ms=100)  # 2 predicates of 100 ms
    seconds = run_limit(suite, _hosts(sshd_hosts))
    assert seconds >= 0.2  # the predicates ran, one after another, on each host


def test_limit_fails_loudly_when_a_predicate_fails(sshd_hosts: Any, tmp_path: Path) -> None:
    suite = generate_suite(tmp_path / "s", tasks=2, sleep_ms=0)
    (suite.root / "tasks" / suite.predicate_tasks[0] / "repo" / "run_tests.sh").write_text("#!/bin/sh\nexit 3\n")
    with pytest.raises(BaselineError, match="exit 3"):
        run_limit(suite, _hosts(sshd_hosts))


def test_naive_fetches_one_result_per_host_and_task(sshd_hosts: Any, tmp_path: Path) -> None:
    suite = generate_suite(tmp_path / "s", tasks=2, sleep_ms=0)
    hosts = _hosts(sshd_hosts)
    seconds = run_naive(suite, hosts, tmp_path / "out")
    assert seconds > 0
    for h in hosts:
        for task in suite.tasks:
            assert "exit=0" in (tmp_path / "out" / h.name / f"{task}.txt").read_text()
