"""``crosshost hosts`` on the controller itself, with the real runner: the digest is the host's."""

from __future__ import annotations

import sys
from pathlib import Path

from orchestrator.commands.probe import probe
from orchestrator.commands.replay import ReplayRequest, replay

TRIAGE = Path(__file__).resolve().parents[2] / "examples" / "suites" / "triage"


def test_probe_digest_is_stable_and_is_the_one_a_replay_records(tmp_path: Path) -> None:
    root = tmp_path / "root"
    inventory = tmp_path / "hosts.toml"
    # A real interpreter, not a pyenv shim (a shim adds its own PYENV_* variables).
    inventory.write_text(
        f'[defaults]\npython = "{sys.executable}"\nworkspace_root = "{root}"\n'
        '[[hosts]]\nname = "local"\ntransport = "local"\n'
    )
    first, second = probe(inventory), probe(inventory)
    assert first[0].error is None and first[0].cleaned is True, first
    assert first[0].fingerprint and first[0].fingerprint == second[0].fingerprint

    probed = probe(inventory, suite=TRIAGE)[0]
    out = replay(
        ReplayRequest(suite_dir=TRIAGE, inventory_path=inventory, out=tmp_path / "runs", tasks=["locale-probe"], repeat=1),
        with_analysis=False,
    )
    rec = out.manifest.hosts["local"]
    assert rec.error is None, rec
    assert rec.fingerprint == probed.fingerprint
    # the versions of the commands the suite's tools.json allows are part of the host's digest
    assert probed.fingerprint != first[0].fingerprint
    assert list((root / "runs").iterdir()) == []  # no probe (or run) directory left
