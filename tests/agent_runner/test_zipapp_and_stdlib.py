"""The runner travels as one reproducible zipapp and needs nothing but the standard library (3.9+)."""

from __future__ import annotations

import ast
import hashlib
import json
import subprocess
import sys
from pathlib import Path

from orchestrator.hosts.runner_zipapp import build_runner_zipapp
from tests.support.runner import REPO, TRIAGE, records

PACKAGE = REPO / "agent_runner"
SYSTEM_PYTHON = "/usr/bin/python3"


def test_two_builds_are_byte_identical_and_named_by_their_sha(tmp_path: Path) -> None:
    first = build_runner_zipapp(tmp_path / "a")
    second = build_runner_zipapp(tmp_path / "b")
    digest = hashlib.sha256(first.read_bytes()).hexdigest()
    assert first.name == f"runner-{digest}.pyz"
    assert second.read_bytes() == first.read_bytes()


def test_zipapp_runs_under_env_i_with_the_system_python(tmp_path: Path) -> None:
    pyz = build_runner_zipapp(tmp_path / "dist")
    done = subprocess.run(["env", "-i", "PATH=/usr/bin:/bin", SYSTEM_PYTHON, str(pyz), "fingerprint"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    # LC_CTYPE: Python's own C-locale coercion (PEP 538) adds it under env -i
    assert data["cwd"] == str(tmp_path) and set(data["env_keys"]) - {"LC_CTYPE"} == {"PATH"}
    assert len(data["fingerprint"]) == 16 and data["python"].startswith("CPython 3.")


def test_zipapp_and_source_tree_agree_on_runner_source_sha_and_run_the_suite(tmp_path: Path) -> None:
    pyz = build_runner_zipapp(tmp_path / "dist")
    env = ["env", "-i", "PATH=/usr/bin:/bin", "LANG=C.UTF-8"]
    zipped = subprocess.run([*env, SYSTEM_PYTHON, str(pyz), "version"], capture_output=True, text=True, timeout=60)
    source = subprocess.run([sys.executable, "-m", "agent_runner", "version"], capture_output=True, text=True,
                            cwd=REPO, timeout=60)
    assert json.loads(zipped.stdout)["runner_source_sha"] == json.loads(source.stdout)["runner_source_sha"]
    done = subprocess.run([*env, SYSTEM_PYTHON, str(pyz), "run", "--suite", str(TRIAGE), "--out", str(tmp_path / "o"),
                           "--tasks", "restart-unhealthy-only,shape-shifter", "--repeat", "1"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    header = records(tmp_path / "o" / "traces" / "shape-shifter.0.jsonl")[0]
    assert header["pins"]["runner_source_sha"] == json.loads(source.stdout)["runner_source_sha"]


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_every_import_in_agent_runner_is_from_the_standard_library() -> None:
    files = sorted(PACKAGE.glob("*.py"))
    assert len(files) > 10
    foreign = {f"{path.name}: {name}" for path in files for name in _imports(path)
               if name not in sys.stdlib_module_names and name != "__future__"}
    assert foreign == set()


def test_vermin_says_python_3_9_is_enough() -> None:
    # the test venv's own vermin, wherever the venv is (not only a checkout's .venv)
    done = subprocess.run([str(Path(sys.executable).parent / "vermin"), "-q", "--no-tips", "-t=3.9-", "--violations",
                           str(PACKAGE), str(REPO / "orchestrator" / "hosts" / "runner_boot.py")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
