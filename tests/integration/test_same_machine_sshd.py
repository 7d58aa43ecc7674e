"""One machine under two inventory names, workspaces a worker did not create, pinned values: on real
sshd hosts (each test host is a machine of its own: its own /etc/machine-id).

What a user relies on: two names for one box never race on one workspace, never delete each other's
live workspace, and the run says they are one machine (``same_host``) instead of calling it valid; a
workspace this worker did not create is left alone; a pinned value is seen by the attempts but
never by ``ps`` on the host, and never written to manifest.json.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from orchestrator.commands.replay import ReplayRequest, replay
from orchestrator.errors import RunnerCrashed
from orchestrator.hosts.transport import open_host
from orchestrator.hosts.workspace import Workspace
from tests.support.runner import predicate_suite

pytestmark = pytest.mark.sshd



def _two_names(sshd_hosts: Any, tmp_path: Path, *, own_roots: bool) -> Path:
    """An inventory naming box-a twice (box-a, box-a-again: one sshd), no local host."""
    text = sshd_hosts.fleet.write_inventory(tmp_path / "base.toml", ["box-a"], include_local=False).read_text()
    entry = text[text.index("[[hosts]]"):]
    again = entry.replace('name = "box-a"', 'name = "box-a-again"')
    if own_roots:
        entry += 'workspace_root = "/tmp/root-one"\n'
        again += 'workspace_root = "/tmp/root-two"\n'
    path = tmp_path / "hosts.toml"
    path.write_text(text[: text.index("[[hosts]]")] + entry + "\n" + again)
    return path


def _runs_left(sshd_hosts: Any) -> str:
    host = open_host(sshd_hosts.config("box-a"))
    try:
        return host.exec(["sh", "-c", "ls -d /tmp/crosshost/runs/* /tmp/root-*/runs/* 2>/dev/null; true"], 30).stdout
    finally:
        host.close()


@pytest.mark.parametrize("own_roots", [False, True], ids=["one-root", "two-roots"])
def test_one_machine_under_two_names_runs_and_is_reported_as_the_same_machine(
    sshd_hosts: Any, tmp_path: Path, own_roots: bool
) -> None:
    inventory = _two_names(sshd_hosts, tmp_path, own_roots=own_roots)
    suite = predicate_suite(tmp_path, "sleep 1\necho ok", tasks=2)
    out = replay(ReplayRequest(suite_dir=suite, inventory_path=inventory, out=tmp_path / "runs"))
    m = out.manifest
    # no race: each name had a workspace of its own, and neither cleanup removed the other's
    assert out.exit_code != 3, (out.exit_reason, out.errors)
    for name in ("box-a", "box-a-again"):
        rec = m.hosts[name]
        assert rec.error is None and rec.workspace_removed is True, (name, rec)
    manifest_text = (out.run_dir.path / "manifest.json").read_text()
    assert "File exists" not in manifest_text
    assert not re.search(re.escape(m.run_id), _runs_left(sshd_hosts))
    fps = {n: json.loads((out.run_dir.path / "hosts" / n / "fingerprint.json").read_text()) for n in m.hosts}
    assert fps["box-a"]["cwd"] != fps["box-a-again"]["cwd"]
    assert fps["box-a"]["machine_identity_complete"] is True, (
        "the test hosts need /etc/machine-id on this machine to each get a machine id of their own"
    )
    # reported as one machine: every task same_host, the run not valid, and a note that says why
    report = out.report
    assert report is not None
    assert {t.task: t.classification for t in report.tasks} == {"t-0": "same_host", "t-1": "same_host"}
    assert not report.valid and out.exit_code == 1
    assert any("different machines" in r and "box-a-again" in r for r in report.invalid_reasons), report.invalid_reasons
    assert any("box-a-again is the same machine as box-a" in n for n in report.notes), report.notes


def test_two_test_hosts_and_local_are_three_machines(sshd_hosts: Any, tmp_path: Path) -> None:
    suite = predicate_suite(tmp_path, "echo ok", tasks=1)
    out = replay(ReplayRequest(suite_dir=suite, inventory_path=sshd_hosts.inventory_path, out=tmp_path / "runs"))
    identities = {
        n: json.loads((out.run_dir.path / "hosts" / n / "fingerprint.json").read_text())["machine_identity"]
        for n in ("local", "box-a", "box-b")
    }
    assert len(set(identities.values())) == 3 and None not in identities.values(), identities
    assert out.report is not None and out.report.tasks[0].classification == "agree"
    assert not any("same machine" in n for n in out.report.notes)


def test_a_workspace_this_worker_did_not_create_is_left_alone(sshd_hosts: Any) -> None:
    cfg = sshd_hosts.config("box-a")
    run_id = f"owner-{uuid.uuid4().hex[:8]}"
    first_host, second_host = open_host(cfg), open_host(cfg)
    try:
        first = Workspace(first_host, cfg.name, cfg.workspace_root, run_id)
        first.create()
        first.put(Path(__file__), "live.py")
        # a second worker at the same path: it cannot create it, and its cleanup leaves it alone
        second = Workspace(second_host, cfg.name, cfg.workspace_root, run_id)
        with pytest.raises(RunnerCrashed, match="File exists"):
            second.create()
        assert second.remove(kill_first=True, prune_bundles=True) is False
        assert first_host.exec(["test", "-f", f"{first.path}/live.py"], 30).ok
        # the one that made it removes it
        assert first.remove() is True
        assert not first_host.exec(["test", "-e", first.path], 30).ok
        # a stale directory nobody's token names (a crashed controller's): left alone too
        assert first_host.exec(["mkdir", "-p", f"{first.path}/work"], 30).ok
        third = Workspace(second_host, cfg.name, cfg.workspace_root, run_id)
        assert third.remove() is False
        assert first_host.exec(["test", "-d", f"{first.path}/work"], 30).ok
    finally:
        first_host.exec(["rm", "-rf", first.path], 30)
        first_host.close()
        second_host.close()


def test_a_pinned_value_is_in_no_command_line_on_the_host_and_not_in_the_manifest(
    sshd_hosts: Any, tmp_path: Path
) -> None:
    value = f"pinned-{uuid.uuid4().hex}"
    base = sshd_hosts.fleet.write_inventory(tmp_path / "base.toml", ["box-a", "box-b"], include_local=False)
    inventory = tmp_path / "hosts.toml"
    inventory.write_text(
        base.read_text().replace(
            "[defaults]\n",
            '[defaults]\nenv_allowlist = ["PATH", "LANG", "TZ", "DEPLOY_STAGE"]\n'
            f'env = {{ DEPLOY_STAGE = "{value}" }}\n',
            1,
        )
    )
    # the attempt sees the value, and stays long enough for the host's process list to be read
    suite = predicate_suite(tmp_path, f'test "$DEPLOY_STAGE" = "{value}" || exit 1\nsleep 4\necho ok', tasks=1)
    done: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: done.update(out=replay(ReplayRequest(suite_dir=suite, inventory_path=inventory,
                                                            out=tmp_path / "runs"))),
        daemon=True,
    )
    thread.start()
    host = open_host(sshd_hosts.config("box-a"))
    seen_runner = False
    holding: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while thread.is_alive() and time.monotonic() < deadline:
            # every process's command line, as `ps` on box-a reads it
            listing = host.exec(
                ["sh", "-c", 'for f in /proc/[0-9]*/cmdline; do tr "\\000" " " < "$f" 2>/dev/null; echo; done'], 30
            ).stdout
            seen_runner = seen_runner or "runner.pyz run" in listing
            holding += [line for line in listing.splitlines() if value in line]
            time.sleep(0.2)
    finally:
        host.close()
    thread.join(timeout=120)
    out = done["out"]
    assert seen_runner, "the runner was never seen running: the check saw nothing"
    assert holding == [], holding
    assert all(t.classification == "agree" for t in out.report.tasks), [
        (t.task, t.verdicts, t.why) for t in out.report.tasks
    ]
    manifest = (out.run_dir.path / "manifest.json").read_text()
    assert value not in manifest and "DEPLOY_STAGE" in manifest  # the key is recorded, never its value
