"""The runner on a host starts isolated (``python -I``): what an attempt of its uid could leave for the
next run to import (a user site-packages with a ``usercustomize``, ``PYTHON*`` variables) is never run
by the runner or by its fallback fingerprint."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from orchestrator.commands.replay import ReplayRequest, replay
from orchestrator.store.jsonl import read_jsonl
from tests.support.runner import TRIAGE

SYSTEM_PYTHON = "/usr/bin/python3"  # a venv's interpreter never reads a user site; the system one does


def test_a_usercustomize_left_in_the_hosts_user_site_is_not_imported_by_the_runner(tmp_path: Path) -> None:
    home = tmp_path / "home"
    site_dir = Path(subprocess.run(
        [SYSTEM_PYTHON, "-c", "import site; print(site.getusersitepackages())"],
        env={"HOME": str(home), "PATH": os.defpath}, capture_output=True, text=True, check=True,
    ).stdout.strip())  # fmt: skip
    site_dir.mkdir(parents=True)
    marker = tmp_path / "imported"
    (site_dir / "usercustomize.py").write_text(f"open({str(marker)!r}, 'a').write('runner\\n')\n")
    # the plant works: a plain start of this interpreter with that HOME imports it
    subprocess.run([SYSTEM_PYTHON, "-c", "pass"], env={"HOME": str(home), "PATH": os.defpath}, check=True)
    assert marker.read_text() == "runner\n"
    marker.unlink()

    inventory = tmp_path / "hosts.toml"
    inventory.write_text(
        f'[[hosts]]\nname = "a"\ntransport = "local"\nworkspace_root = "{tmp_path}/roots/a"\n'
        f'python = "{SYSTEM_PYTHON}"\nenv_allowlist = ["PATH", "HOME"]\nenv = {{ HOME = "{home}" }}\n'
    )
    out = replay(ReplayRequest(suite_dir=TRIAGE, inventory_path=inventory, out=tmp_path / "runs",
                               tasks=["healthy-no-writes"], repeat=1), with_analysis=False)  # fmt: skip
    rows = read_jsonl(out.run_dir.results_path)
    assert [r["task"] for r in rows] == ["healthy-no-writes"] and out.manifest.hosts["a"].error is None
    assert not marker.exists(), marker.read_text()


def _interpreter_with_a_pth(root: Path, marker: Path) -> Path:
    """The host's ``python3`` (a virtual environment of the system one, made as ``venv`` makes it) with a
    ``.pth`` file in its site-packages that appends a line to ``marker`` whenever ``site`` reads it."""
    version = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python3").symlink_to(SYSTEM_PYTHON)
    (root / "pyvenv.cfg").write_text(f"home = {Path(SYSTEM_PYTHON).parent}\ninclude-system-site-packages = false\n")
    site = root / "lib" / f"python{version}" / "site-packages"
    site.mkdir(parents=True)
    (site / "zz-plant.pth").write_text(f"import sys; open({str(marker)!r}, 'a').write(' '.join(sys.argv[:1]) + '\\n')\n")
    return root / "bin" / "python3"


def test_a_pth_file_in_the_hosts_site_packages_runs_in_no_python_crosshost_starts_there(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    python = _interpreter_with_a_pth(tmp_path / "venv", marker)
    # the plant works: an isolated start (-I) of that interpreter still reads its site-packages
    subprocess.run([str(python), "-I", "-c", "pass"], env={"PATH": os.defpath}, check=True)
    assert marker.read_text().startswith("-c\n")
    marker.unlink()

    inventory = tmp_path / "hosts.toml"
    inventory.write_text(
        f'[[hosts]]\nname = "a"\ntransport = "local"\nworkspace_root = "{tmp_path}/roots/a"\npython = "{python}"\n'
    )
    # twice: the second finds the bundle cached and checks it with the host's Python (the first pushes it)
    for _ in range(2):
        out = replay(ReplayRequest(suite_dir=TRIAGE, inventory_path=inventory, out=tmp_path / "runs",
                                   tasks=["healthy-no-writes"], repeat=1), with_analysis=False)  # fmt: skip
        record = out.manifest.hosts["a"]
        assert record.error is None and record.workspace_removed, record
        assert [r["task"] for r in read_jsonl(out.run_dir.results_path)] == ["healthy-no-writes"]
    assert not record.bundle_pushed  # the second run used the checked cache
    # not the runner, not the bundle's check, not the cleanup's process scan
    assert not marker.exists(), marker.read_text()
