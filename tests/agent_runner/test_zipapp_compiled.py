"""A root runner of a pushed bundle runs from a compiled copy of the zipapp's sources kept beside the
bundle, and only when no one but root may write that copy and its sources are the zipapp's: then it
does what the zipapp does (same source digest, same results); anything else runs from the zipapp."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.hosts import runner_boot
from orchestrator.hosts.runner_zipapp import runner_zipapp_bytes
from tests.support.runner import TRIAGE, records

SYSTEM_PYTHON = "/usr/bin/python3"
ENV = ["env", "-i", "PATH=/usr/bin:/bin", "LANG=C.UTF-8"]
TAG = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print(sys.implementation.cache_tag)"],
                     capture_output=True, text=True, check=True).stdout.strip()


def _bundle(root: Path) -> Path:
    """``runner.pyz`` where a host keeps a pushed bundle: ``<workspace_root>/bundles/<sha>/``."""
    data = runner_zipapp_bytes()
    bundle = root / "bundles" / hashlib.sha256(data).hexdigest()
    bundle.mkdir(parents=True)
    (bundle / "runner.pyz").write_bytes(data)
    for d in (root, root / "bundles", bundle):
        d.chmod(0o755)
    return bundle / "runner.pyz"


def _version(pyz: Path) -> dict[str, str]:
    done = subprocess.run([*ENV, SYSTEM_PYTHON, str(pyz), "version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    version: dict[str, str] = json.loads(done.stdout)
    return version


def _copy(pyz: Path) -> Path:
    return pyz.parent.parent / f"{pyz.parent.name}.pyc-{TAG}" / "agent_runner"


@pytest.fixture
def pyz(tmp_path: Path) -> Path:
    assert os.geteuid() == 0, "needs root: only a root runner keeps a compiled copy"
    tmp_path.chmod(0o755)
    return _bundle(tmp_path / "ws")


@pytest.mark.root
def test_the_second_run_imports_the_copy_the_first_made_and_runs_as_the_zipapp_does(pyz: Path, tmp_path: Path) -> None:
    zipped = json.loads(subprocess.run([*ENV, SYSTEM_PYTHON, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                                        "from agent_runner.pins import runner_source_sha as s; "
                                        "import json; print(json.dumps({'sha': s()}))", str(pyz)],
                                       capture_output=True, text=True, timeout=60, check=True).stdout)["sha"]
    assert _version(pyz)["runner_source_sha"] == zipped
    copy = _copy(pyz)
    assert sorted(p.name for p in copy.glob("*.py")) == sorted(runner_boot.zipped_sources(str(pyz)))
    compiled = sorted(p.name for p in (copy / "__pycache__").iterdir())
    assert f"pins.{TAG}.pyc" in compiled and (copy.stat().st_mode & 0o777) == 0o755
    assert _version(pyz)["runner_source_sha"] == zipped  # the second run, from the copy's bytecode
    results = []
    (tmp_path / "plain").mkdir()
    shutil.copy(pyz, tmp_path / "plain" / "r.pyz")  # the same zipapp where it keeps no copy: not a bundle's
    for name, runner in (("copy", pyz), ("zip", tmp_path / "plain" / "r.pyz")):
        out = tmp_path / f"out-{name}"
        done = subprocess.run([*ENV, SYSTEM_PYTHON, str(runner), "run", "--suite", str(TRIAGE), "--out", str(out),
                               "--tasks", "restart-unhealthy-only,shape-shifter", "--repeat", "1", "--run-id", "r1",
                               "--host", "h"], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
        header = records(out / "traces" / "shape-shifter.0.jsonl")[0]
        results.append(([(r["task"], r["verdict"], r["reason"]) for r in rows], header["pins"]))
    assert results[0] == results[1]
    assert not list((tmp_path / "plain").glob("*.pyc-*"))


def _plant(copy: Path) -> None:
    """What an attempt that could write the copy would do: bytecode of its own for the package, which
    the interpreter takes without looking at the source (unchecked hash); its version says "planted"."""
    planted = copy.parent / "planted.py"
    planted.write_text((copy / "__init__.py").read_text().replace('__version__ = "', '__version__ = "planted-'))
    subprocess.run([SYSTEM_PYTHON, "-c", "import py_compile as p, sys; p.compile(sys.argv[1], cfile=sys.argv[2], "
                    "doraise=True, invalidation_mode=p.PycInvalidationMode.UNCHECKED_HASH)",
                    str(planted), str(copy / "__pycache__" / f"__init__.{TAG}.pyc")], check=True)
    planted.unlink()


@pytest.mark.root
def test_a_copy_whose_sources_differ_from_the_zipapp_is_not_imported(pyz: Path) -> None:
    _version(pyz)
    copy = _copy(pyz)
    _plant(copy)
    assert _version(pyz)["version"].startswith("planted")  # root's alone and the same sources: used
    (copy / "words.py").write_text((copy / "words.py").read_text() + "\n")
    assert not _version(pyz)["version"].startswith("planted")
    (copy / "words.py").write_text((copy / "words.py").read_text()[:-1])
    (copy / "extra.py").write_text("")
    assert not _version(pyz)["version"].startswith("planted")


@pytest.mark.root
@pytest.mark.parametrize("where", ["copy", "package", "bundles", "pycache", "source", "bytecode"])
def test_a_copy_someone_else_may_write_is_not_imported(pyz: Path, where: str) -> None:
    _version(pyz)
    copy = _copy(pyz)
    _plant(copy)
    assert _version(pyz)["version"].startswith("planted")  # root's alone: used (so the cases below can fail)
    if where == "package":
        os.chown(copy, 1_990_004_242, 1_990_004_242)  # another uid's
    elif where == "source":
        (copy / "words.py").chmod(0o666)
    elif where == "bytecode":
        next((copy / "__pycache__").glob("*.pyc")).chmod(0o666)
    else:
        target = {"copy": copy.parent, "bundles": copy.parent.parent, "pycache": copy / "__pycache__"}[where]
        target.chmod(0o777 if where != "bundles" else 0o775)
    assert not _version(pyz)["version"].startswith("planted")


@pytest.mark.root
def test_a_copy_of_a_bundle_no_longer_on_the_host_goes_when_a_new_one_is_made(pyz: Path) -> None:
    bundles = pyz.parent.parent
    gone = bundles / f"{'0' * 64}.pyc-{TAG}"
    (gone / "agent_runner").mkdir(parents=True)
    kept = bundles / f"{'1' * 64}.pyc-{TAG}"
    kept.mkdir()
    (bundles / ("1" * 64)).mkdir()
    _version(pyz)
    assert not gone.exists() and kept.is_dir() and _copy(pyz).is_dir()


def test_only_a_bundles_runner_keeps_a_copy() -> None:
    sha = "a" * 64
    assert runner_boot.cache_dir(f"/w/bundles/{sha}/runner.pyz") == f"/w/bundles/{sha}.pyc-{sys.implementation.cache_tag}"
    assert runner_boot.cache_dir("/w/runs/x/runner.pyz") is None
    assert runner_boot.cache_dir(f"/w/bundles/{sha}/other.pyz") is None


@pytest.mark.root
def test_root_only_directories_qualify_and_a_sticky_one_only_above(pyz: Path, tmp_path: Path) -> None:
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    (sticky / "mine").mkdir()
    (sticky / "mine").chmod(0o755)
    assert runner_boot.only_root_writes(str(sticky / "mine"))
    assert not runner_boot.only_root_writes(str(sticky))  # itself writable by all
    (sticky / "open").mkdir()
    (sticky / "open").chmod(0o777)
    (sticky / "open" / "below").mkdir()
    assert not runner_boot.only_root_writes(str(sticky / "open" / "below"))  # not sticky: anyone may rename
    os.chown(sticky / "mine", 1_990_004_242, 0)
    assert not runner_boot.only_root_writes(str(sticky / "mine"))


@pytest.mark.root
def test_a_copy_made_under_umask_000_is_root_s_alone_and_used(pyz: Path) -> None:
    """A runner started with umask 000 makes the copy (its files and the __pycache__ the interpreter
    fills) writable by root alone, so it is used, as under any other umask."""
    done = subprocess.run([*ENV, "sh", "-c", f'umask 000 && exec {SYSTEM_PYTHON} "$0" version', str(pyz)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    copy = _copy(pyz)
    modes = {p.name: p.stat().st_mode & 0o777 for p in [copy, *copy.iterdir(), *(copy / "__pycache__").iterdir()]}
    assert any(name.endswith(".pyc") for name in modes), modes
    assert all(mode & 0o022 == 0 for mode in modes.values()), modes
    _plant(copy)
    assert _version(pyz)["version"].startswith("planted")  # root's alone: used
