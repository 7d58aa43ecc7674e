"""hosts.toml: merging, path resolution, and one-line errors naming file, host and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import InventoryError
from orchestrator.hosts.inventory import load_inventory

GOOD = """\
[defaults]
env_allowlist = ["PATH", "LANG", "LC_ALL", "TZ"]
workspace_root = "/tmp/crosshost"
timeout_s = 60
known_hosts = "known_hosts"

[[hosts]]
name = "local"
transport = "local"

[[hosts]]
name = "box-b"
transport = "ssh"
address = "127.0.0.1"
port = 2222
user = "root"
identity_file = "keys/id_ed25519"
timeout_s = 30
env = { TZ = "UTC" }
"""


def _write(tmp_path: Path, text: str, *, key: bool = True) -> Path:
    if key:
        (tmp_path / "keys").mkdir(exist_ok=True)
        (tmp_path / "keys" / "id_ed25519").write_text("not really a key\n")
    path = tmp_path / "hosts.toml"
    path.write_text(text)
    return path


def _error(path: Path) -> str:
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(path))
    assert info.value.exit_code == 2
    return message


def test_defaults_merge_and_relative_paths_resolve_against_the_file(tmp_path: Path) -> None:
    inv = load_inventory(_write(tmp_path, GOOD))
    assert [h.name for h in inv.hosts] == ["local", "box-b"]
    assert inv.reference.name == "local"
    box = inv.get("box-b")
    assert box.transport == "ssh" and box.port == 2222 and box.user == "root"
    assert box.identity_file == (tmp_path / "keys" / "id_ed25519").resolve()
    assert box.known_hosts == (tmp_path / "known_hosts").resolve()
    assert box.timeout_s == 30  # per-host override
    assert inv.reference.timeout_s == 60  # from [defaults]
    assert box.env == {"TZ": "UTC"}
    assert box.connect_timeout_s == 10


def test_relative_paths_do_not_depend_on_the_working_directory(tmp_path: Path, monkeypatch) -> None:
    path = _write(tmp_path, GOOD)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    inv = load_inventory(Path("..") / "hosts.toml")
    assert inv.get("box-b").identity_file == (tmp_path / "keys" / "id_ed25519").resolve()
    assert path.exists()


def test_known_hosts_defaults_to_the_file_next_to_the_inventory(tmp_path: Path) -> None:
    text = GOOD.replace('known_hosts = "known_hosts"\n', "")
    inv = load_inventory(_write(tmp_path, text))
    assert inv.get("box-b").known_hosts == (tmp_path / "known_hosts").resolve()


def test_select_keeps_inventory_order_and_rejects_unknown_names(tmp_path: Path) -> None:
    inv = load_inventory(_write(tmp_path, GOOD))
    assert [h.name for h in inv.select(["box-b", "local"])] == ["local", "box-b"]
    with pytest.raises(InventoryError, match="no host 'box-z'"):
        inv.select(["box-z"])


def test_public_dict_has_no_key_paths(tmp_path: Path) -> None:
    inv = load_inventory(_write(tmp_path, GOOD))
    public = inv.get("box-b").public_dict()
    assert public["name"] == "box-b" and public["port"] == 2222 and public["env"] == ["TZ"]
    assert "identity_file" not in public and "known_hosts" not in public
    assert str(tmp_path) not in repr(public)


def test_toml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    msg = _error(_write(tmp_path, GOOD.replace('port = 2222', 'port = = 2222')))
    assert msg.startswith(f"{tmp_path / 'hosts.toml'}:15:")
    assert "TOML syntax error" in msg


def test_unknown_key_names_host_and_key(tmp_path: Path) -> None:
    msg = _error(_write(tmp_path, GOOD.replace("address =", "adress =")))
    assert msg == f"{tmp_path / 'hosts.toml'}: host 'box-b': unknown key 'adress'"


def test_unknown_key_in_defaults(tmp_path: Path) -> None:
    msg = _error(_write(tmp_path, GOOD.replace("timeout_s = 60", "timeout = 60")))
    assert msg.endswith("[defaults]: unknown key 'timeout'")


def test_unknown_top_level_key(tmp_path: Path) -> None:
    msg = _error(_write(tmp_path, "[host]\nname = 'x'\n" + GOOD))
    assert "unknown key 'host'" in msg


def test_duplicate_host_name(tmp_path: Path) -> None:
    text = GOOD + '\n[[hosts]]\nname = "local"\ntransport = "local"\n'
    msg = _error(_write(tmp_path, text))
    assert msg == f"{tmp_path / 'hosts.toml'}: host 'local': key 'name': duplicate host name (also host #1)"


def test_ssh_host_without_address(tmp_path: Path) -> None:
    msg = _error(_write(tmp_path, GOOD.replace('address = "127.0.0.1"\n', "")))
    assert msg == (
        f"{tmp_path / 'hosts.toml'}: host 'box-b': key 'address': missing (an ssh host needs an address or an ssh alias)"
    )


def test_missing_identity_file(tmp_path: Path) -> None:
    msg = _error(_write(tmp_path, GOOD, key=False))
    assert "host 'box-b': key 'identity_file':" in msg
    assert "keys/id_ed25519 does not exist" in msg


def test_ssh_host_needs_an_identity_file(tmp_path: Path) -> None:
    msg = _error(_write(tmp_path, GOOD.replace('identity_file = "keys/id_ed25519"\n', "")))
    assert "host 'box-b': key 'identity_file': missing" in msg


def test_pinned_env_must_be_allowlisted(tmp_path: Path) -> None:
    msg = _error(_write(tmp_path, GOOD.replace('env = { TZ = "UTC" }', 'env = { FEATURE_FLAGS = "x" }')))
    assert "host 'box-b': key 'env': 'FEATURE_FLAGS' is not in env_allowlist" in msg


def test_wrong_type_names_the_key(tmp_path: Path) -> None:
    msg = _error(_write(tmp_path, GOOD.replace("port = 2222", 'port = "twenty"')))
    assert "host 'box-b': key 'port':" in msg


def test_missing_name_names_the_host_by_position(tmp_path: Path) -> None:
    msg = _error(_write(tmp_path, GOOD.replace('name = "local"\n', "")))
    assert msg == f"{tmp_path / 'hosts.toml'}: host #1: key 'name': missing"


def test_unsafe_host_name(tmp_path: Path) -> None:
    msg = _error(_write(tmp_path, GOOD.replace('name = "box-b"', 'name = "../b"')))
    assert "key 'name':" in msg


def test_no_hosts(tmp_path: Path) -> None:
    assert "no hosts" in _error(_write(tmp_path, "[defaults]\ntimeout_s = 3\n"))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="cannot read inventory"):
        load_inventory(tmp_path / "nope.toml")


def test_repository_demo_inventory_is_valid_once_keys_exist() -> None:
    # The demo inventory points at files `make demo` generates; check its structure, not the keys.
    root = Path(__file__).resolve().parents[2]
    text = (root / "hosts.toml").read_text()
    import tomllib

    data = tomllib.loads(text)
    names = [h["name"] for h in data["hosts"]]
    assert names[0] == "local" and "box-b" in names
    box = next(h for h in data["hosts"] if h["name"] == "box-b")
    assert (box["address"], box["port"]) == ("127.0.0.1", 2222)
    assert box["identity_file"] == ".state/keys/id_ed25519"
    assert data["defaults"]["known_hosts"] == ".state/known_hosts"
