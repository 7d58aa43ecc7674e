"""A replay reads its suite once: the lint checks it and the bundle ships it. The bundle built from
that one reading is the bundle the plain way built (the suite read again inside ``build_bundle``,
kept here as the reference), byte for byte."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

import agent_runner.suite as suite_module
from agent_runner.suite import load_suite
from bench.gen_suite import generate_suite
from orchestrator.commands.replay import ReplayRequest, replay_command
from orchestrator.errors import HostUnreachable
from orchestrator.hosts.bundle import replay_bundle
from orchestrator.hosts.transport.base import Host

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "suites"


def _suites(tmp_path: Path) -> list[Path]:
    bench = tmp_path / "bench-12"
    generate_suite(bench, 12, 0, name="bench-t12-s0")
    return [EXAMPLES / "triage", EXAMPLES / "coin", bench]


def test_the_bundle_from_the_suite_read_once_is_the_plain_bundle(tmp_path: Path) -> None:
    for n, suite_dir in enumerate(_suites(tmp_path)):
        plain = replay_bundle(suite_dir, tmp_path / f"plain-{n}")  # the suite read inside build_bundle
        once = replay_bundle(suite_dir, tmp_path / f"once-{n}", load_suite(suite_dir))
        assert once.path.read_bytes() == plain.path.read_bytes(), suite_dir
        assert (once.sha, once.suite_sha, once.zipapp_sha) == (plain.sha, plain.suite_sha, plain.zipapp_sha)
        assert once.suite_dir == plain.suite_dir and once.suite.data == plain.suite.data
        assert once.suite.root == plain.suite.root and once.suite.task_ids == plain.suite.task_ids
        # and the cache the read-once bundle left is hit by the plain way (same inputs key)
        again = replay_bundle(suite_dir, tmp_path / f"once-{n}")
        assert again.sha == plain.sha and not again.built


def test_an_edited_file_still_changes_the_bundle_read_once(tmp_path: Path) -> None:
    """The cache key digests every shipped file, not the suite that was read: a file edited after the
    reading (a fixture the suite's reader does not parse) is in the bundle, and the bundle is new."""
    suite_dir = tmp_path / "s"
    generate_suite(suite_dir, 2, 0, name="edited")
    suite = load_suite(suite_dir)
    first = replay_bundle(suite_dir, tmp_path / "cache", suite)
    predicate = next(suite_dir.glob("tasks/*/repo/run_tests.sh"))
    predicate.write_text(predicate.read_text() + "# edited\n")
    edited = replay_bundle(suite_dir, tmp_path / "cache", suite)
    assert edited.built and edited.sha != first.sha
    assert edited.path.read_bytes() == replay_bundle(suite_dir, tmp_path / "plain").path.read_bytes()


def test_a_replay_reads_its_suite_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    suite_dir = tmp_path / "s"
    generate_suite(suite_dir, 3, 0, name="once")
    inventory = tmp_path / "hosts.toml"
    inventory.write_text(
        f'[defaults]\npython = "{sys.executable}"\n'
        + "".join(f'[[hosts]]\nname = "{n}"\ntransport = "local"\nworkspace_root = "{tmp_path}/roots/{n}"\n'
                  for n in ("a", "b"))
    )  # fmt: skip
    reads: list[Path] = []
    real = suite_module.read_suite

    def counted(directory: Any) -> suite_module.Suite:
        reads.append(Path(directory))
        return real(directory)

    monkeypatch.setattr(suite_module, "read_suite", counted)

    def down(cfg: Any, *, accept_new: bool = False, on_retry: Any = None) -> Host:
        raise HostUnreachable(cfg.name, "127.0.0.1:1: connection refused (gave up)")

    request = ReplayRequest(suite_dir=suite_dir, inventory_path=inventory, out=tmp_path / "runs",
                            cache_dir=tmp_path / "cache")  # fmt: skip
    outcome = replay_command(request, opener=down)
    assert reads == [suite_dir.resolve()]
    assert outcome.exit_code == 3 and set(outcome.errors) == {"a", "b"}
    plain = replay_bundle(suite_dir, tmp_path / "plain")
    assert outcome.manifest.bundle_sha == plain.sha and outcome.manifest.suite.sha == plain.suite_sha
