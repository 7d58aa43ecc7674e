"""The machine identity: which machine a fingerprint comes from, and when it may say "the same one"."""

from __future__ import annotations

from pathlib import Path

from agent_runner.fingerprint import machine_identity
from agent_runner.records import Fingerprint

MACHINE_ID = "3d1219c7c4c5404aaa1f6d2a48adfda4"
BOOT_ID = "56c631e9-6ab4-440e-8601-7a4689b75d84"


def _ids(where: Path, machine_id: str | None, boot_id: str | None) -> tuple[list[str], str]:
    """(machine-id files, boot id file) holding these ids (None: the file is missing)."""
    where.mkdir(parents=True, exist_ok=True)
    if machine_id is not None:
        (where / "machine-id").write_text(machine_id + "\n")
    if boot_id is not None:
        (where / "boot_id").write_text(boot_id + "\n")
    return [str(where / "machine-id")], str(where / "boot_id")


def test_two_machines_or_two_boots_differ_and_one_machine_is_the_same(tmp_path: Path) -> None:
    same, complete = machine_identity(*_ids(tmp_path / "a", MACHINE_ID, BOOT_ID))
    again, _ = machine_identity(*_ids(tmp_path / "b", MACHINE_ID, BOOT_ID))
    other, _ = machine_identity(*_ids(tmp_path / "c", "f" * 32, BOOT_ID))
    rebooted, _ = machine_identity(*_ids(tmp_path / "d", MACHINE_ID, "0" * 32))
    assert same is not None and complete is True and same == again
    assert other != same
    assert rebooted != same  # a clone of one image, same machine-id, is told apart by its boot
    assert MACHINE_ID not in same and BOOT_ID.replace("-", "") not in same


def test_without_a_machine_id_the_identity_is_partial_and_never_says_same(tmp_path: Path) -> None:
    identity, complete = machine_identity(*_ids(tmp_path, None, BOOT_ID))
    assert identity is not None and complete is False
    # every container on one kernel shares the boot id: a partial identity claims nothing
    fp = Fingerprint.from_json({"fingerprint": "a" * 16, "machine_identity": identity,
                                "machine_identity_complete": complete})
    assert fp.same_machine_key is None
    assert machine_identity([str(tmp_path / "none")], str(tmp_path / "none")) == (None, False)
    (tmp_path / "machine-id").write_text("uninitialized\n")  # systemd's early-boot placeholder
    assert machine_identity([str(tmp_path / "machine-id")], str(tmp_path / "boot_id"))[1] is False


def test_a_fingerprint_written_before_the_identity_still_loads_and_is_no_machine(tmp_path: Path) -> None:
    old = Fingerprint.from_json({"id": "0123456789abcdef", "hostname": "box-a", "cwd": "/tmp/crosshost/runs/r/work"})
    assert old.fingerprint == "0123456789abcdef" and old.hostname == "box-a"
    assert old.machine_identity is None and old.same_machine_key is None
    new = Fingerprint.from_json({"fingerprint": "b" * 16, "machine_identity": "c" * 32,
                                 "machine_identity_complete": True})
    assert new.same_machine_key == "c" * 32
