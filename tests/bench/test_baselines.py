from pathlib import Path

import pytest

from bench.baselines import ansible_bin


def test_ansible_venv_given_relative_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # ansible-playbook runs with a scratch cwd, so a relative venv path must not survive.
    (tmp_path / "v" / "bin").mkdir(parents=True)
    (tmp_path / "v" / "bin" / "ansible-playbook").write_text("#!/bin/sh\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BENCH_ANSIBLE_VENV", "v")
    found = ansible_bin()
    assert found.is_absolute()
    assert found == tmp_path / "v" / "bin" / "ansible-playbook"
