"""hosts.toml with ssh_config aliases, jump hosts and keys the way people hold them (no sshd needed):
how entries resolve, and the one-line errors (exit 2) before any host is touched."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.errors import InventoryError
from orchestrator.hosts.inventory import load_inventory

REPO = Path(__file__).resolve().parents[2]
TRIAGE = REPO / "examples" / "suites" / "triage"


def _key(path: Path, passphrase: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-C", "test", "-f", str(path)], check=True
    )
    return path


def _write(tmp_path: Path, hosts: str, *, defaults: str = "", ssh_config: str | None = None) -> Path:
    if ssh_config is not None:
        (tmp_path / "ssh_config").write_text(ssh_config)
        defaults = 'ssh_config = "ssh_config"\n' + defaults
    path = tmp_path / "hosts.toml"
    path.write_text(f"[defaults]\n{defaults}\n{hosts}")
    return path


def _error(path: Path) -> str:
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert info.value.exit_code == 2
    message = str(info.value)
    assert "\n" not in message
    return message


SSH_CONFIG = """\
Host db-*
    User deploy
    IdentityFile {key}
    ConnectTimeout 7

Host db-1
    HostName 10.0.0.5
    Port 2201
    ForwardAgent yes
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null

Host behind
    HostName 10.1.0.9
    ProxyJump ops@bastion.example:2022,db-1
"""


def test_an_alias_only_entry_takes_address_port_user_key_and_timeout_from_ssh_config(tmp_path: Path) -> None:
    key = _key(tmp_path / "id")
    inv = load_inventory(
        _write(tmp_path, '[[hosts]]\nname = "db"\nssh = "db-1"\n', ssh_config=SSH_CONFIG.format(key=key))
    )
    host = inv.get("db")
    assert (host.address, host.port, host.user, host.identity_file, host.connect_timeout_s) == (
        "10.0.0.5",
        2201,
        "deploy",
        key,
        7.0,
    )
    # once each, naming the file: the three directives that would weaken the security model
    assert len(host.notes) == 3
    assert all(n.startswith(f"{tmp_path / 'ssh_config'}: not followed: ") for n in host.notes)
    assert [n.split("not followed: ")[1].split(" (")[0] for n in host.notes] == [
        "ForwardAgent yes",
        "StrictHostKeyChecking no",
        "UserKnownHostsFile /dev/null",
    ]


def test_keys_written_in_the_inventory_win_over_ssh_config(tmp_path: Path) -> None:
    key = _key(tmp_path / "id")
    path = _write(
        tmp_path,
        '[[hosts]]\nname = "db"\nssh = "db-1"\nport = 22\nuser = "root"\n',
        defaults="connect_timeout_s = 3\n",
        ssh_config=SSH_CONFIG.format(key=key),
    )
    host = load_inventory(path).get("db")
    assert (host.address, host.port, host.user, host.connect_timeout_s) == ("10.0.0.5", 22, "root", 3.0)


def test_an_address_that_is_an_ssh_config_alias_is_resolved_too(tmp_path: Path) -> None:
    key = _key(tmp_path / "id")
    path = _write(tmp_path, '[[hosts]]\nname = "db"\naddress = "db-1"\n', ssh_config=SSH_CONFIG.format(key=key))
    assert load_inventory(path).get("db").address == "10.0.0.5"


def test_proxy_jump_from_ssh_config_chains_every_hop_outermost_first(tmp_path: Path) -> None:
    key = _key(tmp_path / "id")
    path = _write(tmp_path, '[[hosts]]\nname = "far"\nssh = "behind"\n', defaults=f'identity_file = "{key}"\n',
                  ssh_config=SSH_CONFIG.format(key=key))  # fmt: skip
    host = load_inventory(path).get("far")
    assert [(h.name, h.address, h.port, h.user) for h in host.jump] == [
        ("ops@bastion.example:2022", "bastion.example", 2022, "ops"),
        ("db-1", "10.0.0.5", 2201, "deploy"),
    ]
    assert host.public_dict()["via"] == ["ops@bastion.example:2022", "db-1"]


def test_proxy_jump_naming_an_inventory_host_uses_that_host_and_its_own_jumps(tmp_path: Path) -> None:
    key = _key(tmp_path / "id")
    hosts = (
        '[[hosts]]\nname = "inner"\naddress = "10.2.0.1"\nproxy_jump = "gw"\n\n'
        '[[hosts]]\nname = "gw"\naddress = "10.1.0.1"\nuser = "jump"\nproxy_jump = "edge"\n\n'
        '[[hosts]]\nname = "edge"\naddress = "203.0.113.7"\nport = 2200\n'
    )
    inv = load_inventory(_write(tmp_path, hosts, defaults=f'identity_file = "{key}"\nssh_config = false\n'))
    assert [(h.name, h.address, h.port) for h in inv.get("inner").jump] == [
        ("edge", "203.0.113.7", 2200),
        ("gw", "10.1.0.1", 22),
    ]


def test_a_proxy_jump_loop_is_refused(tmp_path: Path) -> None:
    key = _key(tmp_path / "id")
    hosts = '[[hosts]]\nname = "a"\naddress = "x"\nproxy_jump = "b"\n\n[[hosts]]\nname = "b"\naddress = "y"\nproxy_jump = "a"\n'
    msg = _error(_write(tmp_path, hosts, defaults=f'identity_file = "{key}"\nssh_config = false\n'))
    assert "key 'proxy_jump': a loop (a -> b -> a)" in msg


def test_an_unknown_alias_names_the_ssh_config_file(tmp_path: Path) -> None:
    key = _key(tmp_path / "id")
    msg = _error(_write(tmp_path, '[[hosts]]\nname = "db"\nssh = "db1"\n', ssh_config=SSH_CONFIG.format(key=key)))
    assert msg == f"{tmp_path / 'hosts.toml'}: host 'db': key 'ssh': no Host 'db1' in {tmp_path / 'ssh_config'}"


def test_an_alias_with_ssh_config_off_says_why(tmp_path: Path) -> None:
    msg = _error(_write(tmp_path, '[[hosts]]\nname = "db"\nssh = "db-1"\n', defaults="ssh_config = false\n"))
    assert "key 'ssh': alias 'db-1' needs an ssh_config (ssh_config = false in [defaults])" in msg


def test_match_exec_is_refused_naming_file_and_line(tmp_path: Path) -> None:
    cfg = "Host a\n    User x\n\nMatch host db-* exec \"test -f /tmp/x\"\n    User y\n"
    msg = _error(_write(tmp_path, '[[hosts]]\nname = "db"\nssh = "a"\n', ssh_config=cfg))
    assert msg.startswith(f"ssh_config {tmp_path / 'ssh_config'}:4: 'Match exec' runs a command")


def test_the_default_ssh_config_is_the_users(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = _key(tmp_path / "id")
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(SSH_CONFIG.format(key=key))
    monkeypatch.setenv("HOME", str(home))
    assert load_inventory(_write(tmp_path, '[[hosts]]\nname = "db"\nssh = "db-1"\n')).get("db").port == 2201


# -- keys ---------------------------------------------------------------------------------------


def test_a_locked_key_with_no_way_to_unlock_it_names_the_file_and_both_ways(tmp_path: Path) -> None:
    key = _key(tmp_path / "locked", passphrase="s3cret-words")
    msg = _error(_write(tmp_path, f'[[hosts]]\nname = "db"\naddress = "10.0.0.5"\nidentity_file = "{key}"\n',
                        defaults="ssh_config = false\n"))  # fmt: skip
    assert msg == (
        f"{tmp_path / 'hosts.toml'}: host 'db': key file {key} is passphrase-protected: "
        f"add it to a running ssh-agent (`ssh-add {key}`) and set use_agent = true, "
        'or set passphrase_env = "VAR" naming a controller variable that holds its passphrase'
    )


def test_passphrase_env_unlocks_the_key_and_is_never_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = _key(tmp_path / "locked", passphrase="s3cret-words")
    path = _write(tmp_path, f'[[hosts]]\nname = "db"\naddress = "10.0.0.5"\nidentity_file = "{key}"\n'
                  'passphrase_env = "DB_KEY_PASS"\n', defaults="ssh_config = false\n")  # fmt: skip
    msg = _error(path)
    assert "key 'passphrase_env': DB_KEY_PASS is not set on the controller" in msg
    monkeypatch.setenv("DB_KEY_PASS", "wrong")
    assert _error(path).endswith(f"key file {key}: the passphrase in $DB_KEY_PASS does not unlock it")
    monkeypatch.setenv("DB_KEY_PASS", "s3cret-words")
    host = load_inventory(path).get("db")
    recorded = str(host.public_dict())
    assert "DB_KEY_PASS" not in recorded and "s3cret" not in recorded and str(key) not in recorded


def test_use_agent_needs_an_agent_on_the_controller(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    msg = _error(_write(tmp_path, '[[hosts]]\nname = "db"\naddress = "10.0.0.5"\nuse_agent = true\n',
                        defaults="ssh_config = false\n"))  # fmt: skip
    assert "key 'use_agent': SSH_AUTH_SOCK is not set on the controller" in msg
    monkeypatch.setenv("SSH_AUTH_SOCK", str(tmp_path / "agent.sock"))
    assert load_inventory(tmp_path / "hosts.toml").get("db").identity_file is None


def _crosshost(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    code = "from orchestrator.cli import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=cwd, timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(cwd), "XDG_CACHE_HOME": str(cwd)},
    )  # fmt: skip


def test_hosts_and_replay_agree_a_locked_key_is_exit_2_with_the_same_line(tmp_path: Path) -> None:
    key = _key(tmp_path / "locked", passphrase="s3cret-words")
    inv = _write(tmp_path, f'[[hosts]]\nname = "db"\naddress = "127.0.0.1"\nport = 9\nidentity_file = "{key}"\n')
    hosts = _crosshost("hosts", "-i", str(inv), cwd=tmp_path)
    replay = _crosshost("replay", str(TRIAGE), "-i", str(inv), "--out", str(tmp_path / "runs"), cwd=tmp_path)
    for done in (hosts, replay):
        assert done.returncode == 2, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
        assert f"key file {key} is passphrase-protected" in done.stderr
        assert "use_agent = true" in done.stderr and "passphrase_env" in done.stderr
    assert hosts.stderr == replay.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
