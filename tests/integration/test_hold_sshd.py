"""A held model on local and a real sshd host: the reference's model answers replayed on the other host.

The provider (tests/support/fake_provider.py, mode "random") answers every tool call with one of four argument
sets drawn at random: a sampled model. Held, both hosts get the same answers and agree; unheld, the
same suite shows the shape differences that sampling alone causes. A host whose private /opt holds a
file the reference lacks sees another tool observation: the held model diverges there, at that
request, and the report names the observation.
"""

from __future__ import annotations

import json
import secrets
import shutil
from pathlib import Path
from typing import Any

import pytest

from orchestrator.commands.replay import ReplayRequest, replay
from tests.support.fake_provider import FakeProvider

pytestmark = pytest.mark.sshd

KEY_ENV = "CROSSHOST_IT_HOLD_KEY"
VALUE_DIR = "crosshost-hold"  # /opt/crosshost-hold/value on box-a only
CONTRACT = {
    "contract_id": "hold.v1",
    "tools": [{"name": "lookup", "required_args": ["q"]}, {"name": "shell", "required_args": ["argv"]}],
    "invariants": [],
}
LOOKUPS = [
    {"tool_calls": [{"name": "lookup", "args": {"q": "first"}}]},
    {"tool_calls": [{"name": "lookup", "args": {"q": "second"}}]},
    {"content": "done", "finish": "stop"},
]
READ_VALUE = [
    {"tool_calls": [{"name": "shell", "args": {"argv": ["cat", f"/opt/{VALUE_DIR}/value"]}}]},
    {"tool_calls": [{"name": "lookup", "args": {"q": "after"}}]},
    {"content": "done", "finish": "stop"},
]


def _suite(root: Path, base_url: str, task: str) -> Path:
    suite = root / f"held-{task}"
    (suite / "tasks" / task / "repo").mkdir(parents=True)
    (suite / "suite.toml").write_text(
        'name = "held"\nrepeat = 3\n'
        f'[agent]\nkind = "openai"\nmodel = "m1"\nbase_url = "{base_url}"\napi_key_env = "{KEY_ENV}"\n'
        "[budget]\nmax_steps = 6\ntimeout_s = 60\n"
    )
    (suite / "contract.json").write_text(json.dumps(CONTRACT))
    (suite / "tools.json").write_text(json.dumps({"allow": [f"cat /opt/{VALUE_DIR}/value"], "deny": []}))
    (suite / "tasks" / task / "task.toml").write_text('[fixtures]\nlookup = "looked it up"\n')
    (suite / "tasks" / task / "prompt.md").write_text("Look things up.\n")
    (suite / "tasks" / task / "repo" / "run_tests.sh").write_text("exit 0\n")
    return suite


def _replay(suite: Path, inventory: Path, out: Path, hold: bool | None) -> dict[str, Any]:
    done = replay(
        ReplayRequest(suite_dir=suite, inventory_path=inventory, out=out, hosts=["local", "box-a"], hold_model=hold)
    )
    return json.loads((done.run_dir.path / "report.json").read_text())


def test_a_held_model_agrees_unheld_sampling_differs(
    sshd_hosts: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "sk-it-" + secrets.token_hex(16)
    monkeypatch.setenv(KEY_ENV, key)
    with FakeProvider(script=LOOKUPS, key=key, mode="random") as provider:
        suite = _suite(tmp_path, provider.base_url, "lookups")
        held = _replay(suite, sshd_hosts.inventory_path, tmp_path / "runs", None)  # the default: held
        asked_held = len(provider.requests)
        unheld = _replay(suite, sshd_hosts.inventory_path, tmp_path / "runs", False)
    assert held["hold_model"] == "true"
    [task] = held["tasks"]
    assert task["classification"] == "agree" and task["shape_diff"] == [] and task["evidence"] == "held"
    assert task["model_hold"] == ["model held for 9 of 9 request(s) on box-a"]
    assert asked_held == 9  # three requests, three attempts, the reference only
    # unheld, each host samples its own tool calls: the shapes part
    [task] = unheld["tasks"]
    assert unheld["hold_model"] is None and task["model_hold"] == []
    assert task["shape_diff"] and task["classification"] == "unstable_contract", task


def test_a_host_difference_in_one_observation_is_the_divergence_reported(
    sshd_hosts: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "sk-it-" + secrets.token_hex(16)
    monkeypatch.setenv(KEY_ENV, key)
    value = sshd_hosts.fleet.state / "hosts" / "box-a" / "opt" / VALUE_DIR
    value.mkdir(parents=True)
    (value / "value").write_text("flag=on\n")  # inside box-a only: its /opt is its own
    try:
        with FakeProvider(script=READ_VALUE, key=key, mode="random") as provider:
            suite = _suite(tmp_path, provider.base_url, "read-value")
            report = _replay(suite, sshd_hosts.inventory_path, tmp_path / "runs", None)
    finally:
        shutil.rmtree(value)
    [task] = report["tasks"]
    lines = task["model_hold"]
    assert len(lines) == 3, lines  # one divergence per attempt
    for line in lines:
        assert line.startswith("diverged at request 1 of attempt "), line
        assert "on box-a: tool message 2 differs: 'exit 0\\nflag=on\\n'" in line, line  # box-a's observation
        assert "(reference: 'exit 1\\ncat: /opt/crosshost-hold/value: No such file" in line, line
        assert line.endswith("held for 3 of 9 request(s)"), line  # the first request of each attempt
