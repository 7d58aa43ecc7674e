"""The bundle: reproducible, named by sha256, pushed once as one file, skipped when cached."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import pytest

from orchestrator.bundle import build_bundle, build_suite_tar, ensure_bundle, sha256_file
from orchestrator.errors import SuiteError
from orchestrator.testing import FakeHost
from orchestrator.transport.local import LocalHost

NORMALISED = {"name": "mini", "repeat": 1, "tasks": [{"id": "t1"}]}


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
    bundle = build_bundle(s, tmp_path / "cache", runner=_runner(tmp_path), normalised=NORMALISED)
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
    bundle = build_bundle(s, tmp_path / "cache", runner=_runner(tmp_path), normalised=NORMALISED)
    held: set[str] = set()

    def handler(argv: list[str]) -> tuple[int, str, str]:
        if argv[:2] == ["sh", "-c"] and argv[2].startswith("test -f"):
            return (0 if held else 1), "", ""
        if "mv -T" in argv[-1]:
            held.add(bundle.sha)
        return 0, "", ""

    host = FakeHost("box-b", handler)
    assert ensure_bundle(host, bundle, "/tmp/crosshost") is True
    assert len(host.files) == 1  # one transfer: the bundle tar
    [(remote, data)] = host.files.items()
    assert remote.startswith("/tmp/crosshost/bundles/.tmp-") and data == bundle.path.read_bytes()
    assert host.calls[-1][:2] == ["rm", "-rf"]  # the temporary directory always goes
    assert ensure_bundle(host, bundle, "/tmp/crosshost") is False
    assert len(host.files) == 1
