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


def test_the_zipapp_ends_as_the_plain_runner_does_its_output_whole_its_exit_code_the_same(tmp_path: Path) -> None:
    """The zipapp skips the interpreter's teardown at its end (``runner_boot.end``): what it printed to
    a pipe (block-buffered), what it wrote and its exit code are those of ``python -m agent_runner``,
    which ends through the interpreter's own exit."""
    pyz = build_runner_zipapp(tmp_path / "dist")
    env = ["env", "-i", "PATH=/usr/bin:/bin", "LANG=C.UTF-8"]
    args = ["run", "--suite", str(TRIAGE), "--tasks", "restart-unhealthy-only,shape-shifter", "--repeat", "1"]
    zipped = subprocess.run([*env, SYSTEM_PYTHON, "-I", "-S", str(pyz), *args, "--out", str(tmp_path / "z")],
                            capture_output=True, text=True, timeout=120)
    plain = subprocess.run([*env, SYSTEM_PYTHON, "-S", "-m", "agent_runner", *args, "--out", str(tmp_path / "p")],
                           capture_output=True, text=True, timeout=120, cwd=REPO)
    assert zipped.returncode == plain.returncode == 0, (zipped.stderr, plain.stderr)

    def announced(stdout: str) -> list[str]:  # the digests the controller checks what it pulls against
        return sorted(line.split()[2] for line in stdout.splitlines() if line.startswith("crosshost-digest "))

    assert announced(zipped.stdout) == announced(plain.stdout) != []
    for line in zipped.stdout.splitlines():
        _, digest, name = line.split()
        assert hashlib.sha256((tmp_path / "z" / name).read_bytes()).hexdigest() == digest, name
    verdicts = [[(r["task"], r["verdict"]) for r in records(out / "results.jsonl")] for out in (tmp_path / "z", tmp_path / "p")]
    assert verdicts[0] == verdicts[1] and len(verdicts[0]) == 2
    # bad input: exit 2 and its one line, the same both ways
    bad = ["run", "--suite", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x")]
    zipped = subprocess.run([*env, SYSTEM_PYTHON, "-I", "-S", str(pyz), *bad], capture_output=True, text=True, timeout=60)
    plain = subprocess.run([*env, SYSTEM_PYTHON, "-S", "-m", "agent_runner", *bad], capture_output=True, text=True,
                           timeout=60, cwd=REPO)
    assert zipped.returncode == plain.returncode == 2 and zipped.stderr == plain.stderr and zipped.stderr.startswith("error:")
    version = subprocess.run([*env, SYSTEM_PYTHON, "-I", "-S", str(pyz), "version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and json.loads(version.stdout)["version"]


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
