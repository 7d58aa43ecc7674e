"""hosts.toml values that would only fail later, on a host, are refused up front (exit 2, one line)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import InventoryError
from orchestrator.hosts.inventory import load_inventory

LOCAL = '[[hosts]]\nname = "a"\ntransport = "local"\n'


def _load(tmp_path: Path, extra: str) -> None:
    path = tmp_path / "hosts.toml"
    path.write_text(LOCAL + extra)
    load_inventory(path)


@pytest.mark.parametrize("value", ["inf", "nan", "1e400", "1e12"])
def test_timeout_must_be_a_finite_sane_number(tmp_path: Path, value: str) -> None:
    with pytest.raises(InventoryError, match=r"hosts.toml: host 'a': key 'timeout_s'"):
        _load(tmp_path, f"timeout_s = {value}\n")


def test_connect_timeout_must_be_finite(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match=r"key 'connect_timeout_s'"):
        _load(tmp_path, "connect_timeout_s = inf\n")


def test_pinned_value_with_a_nul_byte_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match=r"host 'a': key 'env'.*TZ"):
        _load(tmp_path, 'env_allowlist = ["TZ"]\nenv = { TZ = "a\\u0000b" }\n')


@pytest.mark.parametrize("root", ["/tmp/..", "/tmp/../etc", "/./", "/tmp/./x", "/tmp//x/.."])
def test_workspace_root_with_dot_components_is_refused(tmp_path: Path, root: str) -> None:
    with pytest.raises(InventoryError, match=r"key 'workspace_root'"):
        _load(tmp_path, f'workspace_root = "{root}"\n')


@pytest.mark.parametrize("key", ["GITHUB_TOKEN", "OPENAI_API_KEY", "SSH_AUTH_SOCK", "PGPASSWORD"])
def test_secret_shaped_allowlist_key_is_refused(tmp_path: Path, key: str) -> None:
    with pytest.raises(InventoryError, match=rf"key 'env_allowlist'.*{key}"):
        _load(tmp_path, f'env_allowlist = ["PATH", "{key}"]\n')


def test_pinned_values_with_shell_syntax_are_accepted(tmp_path: Path) -> None:
    # They are quoted when the command is built (remote.py); the inventory must not mangle them.
    path = tmp_path / "hosts.toml"
    path.write_text(LOCAL + 'env_allowlist = ["TZ"]\nenv = { TZ = "a b \'$(id)\' \\"q\\"\\nx" }\n')
    assert load_inventory(path).hosts[0].env["TZ"] == "a b '$(id)' \"q\"\nx"
