"""The bundle: reproducible, named by sha256, pushed once as one file, skipped when cached."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import pytest

from agent_runner.suite import suite_from_dict
from orchestrator.errors import SuiteError
from orchestrator.hosts.bundle import build_bundle, build_suite_tar, ensure_bundle, sha256_file
from orchestrator.hosts.testing import FakeHost
from orchestrator.hosts.transport.local import LocalHost

NORMALISED = {
    "name": "mini",
    "repeat": 1,
    "agent": {"kind": "none"},
    "contract": {"tools": []},
    "tasks": [{"id": "t1", "prompt": "p"}],
}

def _suite(root: Path) -> Path:
    s = root / "mini"
    (s / "tasks" / "t1" / "repo").mkdir(parents=True)
    (s / "suite.toml").write_text('name = "mini"\n')
    (s / "contract.json").write_text('{"contract_id": "c", "tools": []}\n')
    script = s / "tasks" / "t1" / "repo" / "run_tests.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o755)
    (s / "tasks" / "t1" / "__pycache__").mkdir()
    (s / "tasks" / "t1" / "__pycache__" / "x.pyc").write_bytes(b"junk")
    return s


def _runner(root: Path) -> Path:
    p = root / "runner.pyz"
    p.write_bytes(b"PK fake zipapp")
    return p


def test_suite_tar_is_reproducible_and_carries_suite_json(tmp_path: Path) -> None:
    s = _suite(tmp_path)
    a, sha_a = build_suite_tar(s, NORMALISED, tmp_path / "out1")
    os.utime(s / "contract.json", (1, 1))  # a timestamp must not change the hash
    b, sha_b = build_suite_tar(s, NORMALISED, tmp_path / "out2")
    assert sha_a == sha_b and a.read_bytes() == b.read_bytes()
    assert a.name == f"suite-{sha_a}.tar" and sha256_file(a) == sha_a
    with tarfile.open(a) as tar:
        names = tar.getnames()
        assert "suite.json" in names and "tasks/t1/repo/run_tests.sh" in names
        assert "suite.toml" not in names  # replaced by suite.json: the runner reads TOML first
        assert not any("__pycache__" in n for n in names)
        assert tar.getmember("tasks/t1/repo/run_tests.sh").mode == 0o755
    # Content changes the hash.
    (s / "contract.json").write_text("{}\n")
    _, sha_c = build_suite_tar(s, NORMALISED, tmp_path / "out3")
    assert sha_c != sha_a


def test_symlink_in_suite_is_refused(tmp_path: Path) -> None:
    s = _suite(tmp_path)
    (s / "leak").symlink_to("/etc/hostname")
    with pytest.raises(SuiteError, match="leak"):
        build_suite_tar(s, NORMALISED, tmp_path / "out")


def test_push_is_one_transfer_then_skipped(tmp_path: Path) -> None:
    s = _suite(tmp_path)
    bundle = build_bundle(s, tmp_path / "cache", runner=_runner(tmp_path), suite=suite_from_dict(NORMALISED, s))
    assert bundle.path.name == f"bundle-{bundle.sha}.tar" and sha256_file(bundle.path) == bundle.sha
    root = tmp_path / "ws"
    host = LocalHost("local")
    assert ensure_bundle(host, bundle, str(root)) is True
    cached = Path(bundle.remote_dir(str(root)))
    assert (cached / "runner.pyz").read_bytes() == b"PK fake zipapp"
    assert (cached / "suite" / "suite.json").is_file()
    assert os.access(cached / "suite" / "tasks" / "t1" / "repo" / "run_tests.sh", os.X_OK)
    # Only the published cache entry remains: no temporary directory, no archives.
    assert sorted(p.name for p in (root / "bundles").iterdir()) == [bundle.sha]
    assert not (cached / "bundle.tar").exists() and not (cached / "suite.tar").exists()
    # Second time: the host holds that sha, nothing is pushed.
    assert ensure_bundle(host, bundle, str(root)) is False


def test_push_counts_on_a_fake_host(tmp_path: Path) -> None:
    s = _suite(tmp_path)
    bundle = build_bundle(s, tmp_path / "cache", runner=_runner(tmp_path), suite=suite_from_dict(NORMALISED, s))
    held: set[str] = set()

    def handler(argv: list[str]) -> tuple[int, str, str]:
        if argv[:2] == ["sh", "-c"] and argv[2].startswith("{ test -f"):
            return (0 if held else 1), "", ""
        if "mv -T" in argv[-1]:
            held.add(bundle.sha)
        return 0, "", ""

    host = FakeHost("box-b", handler)
    assert ensure_bundle(host, bundle, "/tmp/crosshost") is True
    assert len(host.files) == 1  # one transfer: the bundle tar
    [(remote, data)] = host.files.items()
    assert remote.startswith("/tmp/crosshost/bundles/.tmp-") and data == bundle.path.read_bytes()
    assert "rm -rf /tmp/crosshost/bundles/.tmp-" in host.calls[-1][-1]  # the temporary directory always goes
    assert ensure_bundle(host, bundle, "/tmp/crosshost") is False
    assert len(host.files) == 1


def _bundle_tar_members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_cache_reuses_an_unchanged_bundle_and_rebuilds_a_changed_one(tmp_path: Path) -> None:
    s, cache = _suite(tmp_path), tmp_path / "cache"
    first = build_bundle(s, cache, runner=_runner(tmp_path), suite=suite_from_dict(NORMALISED, s))
    again = build_bundle(s, cache, runner=_runner(tmp_path), suite=suite_from_dict(NORMALISED, s))
    assert (again.sha, again.suite_sha, again.zipapp_sha, again.path) == (
        first.sha, first.suite_sha, first.zipapp_sha, first.path
    )
    # What a fresh cache builds from the same inputs is what the cache handed back.
    fresh = build_bundle(s, tmp_path / "fresh", runner=_runner(tmp_path), suite=suite_from_dict(NORMALISED, s))
    assert fresh.sha == again.sha and fresh.path.read_bytes() == again.path.read_bytes()
    # A changed file, mode, normalised suite or runner gives a new bundle holding the change.
    (s / "tasks" / "t1" / "repo" / "run_tests.sh").write_text("#!/bin/sh\nexit 1\n")
    edited = build_bundle(s, cache, runner=_runner(tmp_path), suite=suite_from_dict(NORMALISED, s))
    assert edited.sha != first.sha and sha256_file(edited.path) == edited.sha
    (s / "tasks" / "t1" / "repo" / "run_tests.sh").chmod(0o644)
    assert build_bundle(s, cache, runner=_runner(tmp_path), suite=suite_from_dict(NORMALISED, s)).sha != edited.sha
    renamed = build_bundle(s, cache, runner=_runner(tmp_path), suite=suite_from_dict({**NORMALISED, "repeat": 2}, s))
    assert renamed.suite_sha != edited.suite_sha
    other_runner = tmp_path / "other.pyz"
    other_runner.write_bytes(b"PK another zipapp")
    swapped = build_bundle(s, cache, runner=other_runner, suite=suite_from_dict(NORMALISED, s))
    assert _bundle_tar_members(swapped.path)["runner.pyz"] == b"PK another zipapp"


def test_a_damaged_cached_bundle_is_rebuilt_not_used(tmp_path: Path) -> None:
    s, cache = _suite(tmp_path), tmp_path / "cache"
    first = build_bundle(s, cache, runner=_runner(tmp_path), suite=suite_from_dict(NORMALISED, s))
    good = first.path.read_bytes()
    first.path.write_bytes(good[:-512] + b"\0" * 511 + b"x")  # same size, different bytes
    again = build_bundle(s, cache, runner=_runner(tmp_path), suite=suite_from_dict(NORMALISED, s))
    assert again.sha == first.sha and again.path.read_bytes() == good
    for index in cache.glob("index-*.json"):
        index.write_text("{not json")
    assert build_bundle(s, cache, runner=_runner(tmp_path), suite=suite_from_dict(NORMALISED, s)).path.read_bytes() == good


def test_replay_keeps_bundles_in_the_users_cache_shared_by_every_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.hosts.bundle import bundle_cache_dir

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    a = bundle_cache_dir(tmp_path / "runs-a")
    b = bundle_cache_dir(tmp_path / "runs-b")
    assert a == b == tmp_path / "xdg" / "crosshost" / "bundles" and a.is_dir()
    assert (a.stat().st_mode & 0o777) == 0o700
    # Where the user's cache cannot be made, the run directory holds it, as before.
    (tmp_path / "blocked").write_text("a file")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "blocked"))
    assert bundle_cache_dir(tmp_path / "runs-c") == tmp_path / "runs-c" / ".bundles"


def test_the_local_cache_is_bounded_by_age_and_size_and_keeps_the_bundle_in_use(tmp_path: Path) -> None:
    import os
    import time

    from orchestrator.hosts.bundle_cache import prune_local_cache

    cache = tmp_path / "cache"
    cache.mkdir()
    now = time.time()
    for name, age_days, size in (("old", 40, 10), ("in-use-old", 40, 10), ("a", 3, 400), ("b", 2, 400), ("c", 1, 400)):
        path = cache / name
        path.write_bytes(b"x" * size)
        os.utime(path, (now - age_days * 86_400, now - age_days * 86_400))
    removed = prune_local_cache(cache, keep=frozenset({cache / "in-use-old"}), max_bytes=900)
    assert sorted(p.name for p in removed) == ["a", "old"]  # too old; then the least recently used over 900 bytes
    assert sorted(p.name for p in cache.iterdir()) == ["b", "c", "in-use-old"]


def test_a_replay_prunes_the_local_cache_only_when_it_adds_a_bundle(tmp_path: Path) -> None:
    import time

    from orchestrator.hosts.bundle import replay_bundle
    from tests.support.runner import predicate_suite

    s = predicate_suite(tmp_path, "exit 0", tasks=1)
    cache = tmp_path / "cache"
    cache.mkdir()

    def stale(name: str) -> Path:
        path = cache / name
        path.write_bytes(b"x")
        old = time.time() - 40 * 86_400
        os.utime(path, (old, old))
        return path

    first_old = stale("first-old")
    built = replay_bundle(s, cache)
    assert built.built and not first_old.exists()  # the cache grew: unused for 30 days -> removed
    later_old = stale("later-old")
    again = replay_bundle(s, cache)
    assert not again.built and again.sha == built.sha
    assert later_old.exists()  # a cache hit leaves the cache as it is
    (s / "tasks" / "t-0" / "prompt.md").write_text("something else to do\n")
    changed = replay_bundle(s, cache)
    assert changed.built and changed.sha != built.sha and not later_old.exists()
    assert built.path.exists()  # used within 30 days: kept


def test_crosshost_cache_prune_empties_the_local_cache(tmp_path: Path) -> None:
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    cache = tmp_path / "xdg" / "crosshost" / "bundles"
    cache.mkdir(parents=True)
    (cache / "bundle-1.tar").write_bytes(b"x" * 2_000_000)
    (cache / "index-1.json").write_text("{}")
    done = subprocess.run(
        [sys.executable, "-c", "from orchestrator.cli import main; main()", "cache", "prune"],
        capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(repo), "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "xdg")},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"removed 2 file(s), 2.0 MB, from {cache}"
    assert list(cache.iterdir()) == []


def test_the_unpacked_digest_is_computed_once_for_every_host_asking_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading
    import time

    from orchestrator.hosts import bundle as bundle_module

    calls: list[Path] = []
    real = bundle_module._unpacked_digest

    def counted(path: Path) -> str:
        calls.append(path)
        time.sleep(0.05)  # a bundle read and hashed while the other hosts' pushes ask too
        return real(path)

    monkeypatch.setattr(bundle_module, "_unpacked_digest", counted)
    monkeypatch.setattr(bundle_module, "_UNPACKED", {})
    s = _suite(tmp_path)
    b = build_bundle(s, tmp_path / "cache", runner=_runner(tmp_path), suite=suite_from_dict(NORMALISED, s))
    got: list[str] = []
    workers = [threading.Thread(target=lambda: got.append(bundle_module.unpacked_digest(b))) for _ in range(16)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert len(calls) == 1 and got == [real(b.path)] * 16
