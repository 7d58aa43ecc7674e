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
