"""Container hosts in hosts.toml: ``transport = "docker"`` (image or container) and ``"command"`` (an
argv prefix). Each mistake is one line naming the file, the host and the key; the CLI exits 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.errors import InventoryError
from orchestrator.hosts.inventory import load_inventory
from orchestrator.hosts.transport import CommandHost, open_host

HEAD = '[defaults]\ndocker_host = "unix:///run/other.sock"\n\n[[hosts]]\nname = "local"\ntransport = "local"\n'


def _load(tmp_path: Path, host: str) -> Path:
    path = tmp_path / "hosts.toml"
    path.write_text(HEAD + "\n[[hosts]]\n" + host)
    return path


def test_docker_and_command_hosts_load_with_their_keys(tmp_path: Path) -> None:
    path = tmp_path / "hosts.toml"
    path.write_text(
        HEAD
        + '\n[[hosts]]\nname = "img"\ntransport = "docker"\nimage = "debian:12"\npull_timeout_s = 30\n'
        + '\n[[hosts]]\nname = "ctr"\ntransport = "docker"\ncontainer = "box"\n'
        + '\n[[hosts]]\nname = "pod"\ntransport = "command"\nargv = ["kubectl", "exec", "-i", "-n", "evals", "pod-a", "--"]\n'
    )
    inv = load_inventory(path)
    img, ctr, pod = inv.get("img"), inv.get("ctr"), inv.get("pod")
    assert (img.image, img.network, img.pull_timeout_s, img.docker_host) == ("debian:12", "none", 30, "unix:///run/other.sock")
    assert (ctr.container, ctr.image) == ("box", None)
    assert pod.argv == ["kubectl", "exec", "-i", "-n", "evals", "pod-a", "--"]
    assert inv.get("local").docker_host == "unix:///run/other.sock"  # a default, used by docker hosts only


@pytest.mark.parametrize(
    ("host", "says"),
    [
        ('name = "d"\ntransport = "docker"\n', "host 'd': key 'image': a docker host names exactly one of image"),
        ('name = "d"\ntransport = "docker"\nimage = "a"\ncontainer = "b"\n', "host 'd': key 'image': a docker host names exactly one"),
        ('name = "d"\ntransport = "docker"\ncontainer = "b"\nnetwork = "host"\n', "host 'd': keys 'network' and 'pull_timeout_s' are for image hosts"),
        ('name = "d"\ntransport = "docker"\nimage = "--privileged"\n', "host 'd': key 'image': '--privileged' is not valid"),
        ('name = "d"\ntransport = "docker"\nimage = ""\n', "host 'd': key 'image'"),
        ('name = "d"\ntransport = "docker"\nimage = "a"\npull_timeout_s = 0\n', "host 'd': key 'pull_timeout_s'"),
        ('name = "c"\ntransport = "command"\n', "host 'c': key 'argv': missing (a command host needs the exec prefix"),
        ('name = "c"\ntransport = "command"\nargv = []\n', "host 'c': key 'argv': missing"),
        ('name = "c"\ntransport = "command"\nargv = ["docker", ""]\n', "host 'c': key 'argv': an empty word"),
        ('name = "c"\ntransport = "command"\nargv = "docker exec -i box"\n', "host 'c': key 'argv'"),
        ('name = "c"\ntransport = "command"\nargv = ["x"]\nimage = "a"\n', "host 'c': key 'image': only a transport = \"docker\" host has it (this one is command)"),
        ('name = "s"\naddress = "h"\nidentity_file = "k"\nargv = ["x"]\n', "host 's': key 'argv': only a transport = \"command\" host has it (this one is ssh)"),
        ('name = "p"\ntransport = "podman"\n', "host 'p': key 'transport'"),
    ],
)
def test_each_mistake_is_one_line_naming_host_and_key(tmp_path: Path, host: str, says: str) -> None:
    if "identity_file" in host:
        (tmp_path / "k").write_text("x")
    with pytest.raises(InventoryError) as err:
        load_inventory(_load(tmp_path, host))
    line = str(err.value)
    assert "\n" not in line and line.startswith(str(tmp_path / "hosts.toml")) and says in line, line


def test_ssh_keys_on_a_container_host_are_said_to_be_ignored(tmp_path: Path) -> None:
    inv = load_inventory(_load(tmp_path, 'name = "d"\ntransport = "docker"\nimage = "a"\nport = 2222\n'))
    assert inv.get("d").notes == [f"{tmp_path / 'hosts.toml'}: key(s) 'port' ignored: a docker host is reached without SSH"]


def test_the_cli_says_it_in_one_line_and_exits_2(tmp_path: Path) -> None:
    path = _load(tmp_path, 'name = "d"\ntransport = "docker"\n')
    suite = Path(__file__).resolve().parents[2] / "examples" / "suites" / "triage"
    res = subprocess.run([sys.executable, "-m", "orchestrator.cli", "replay", str(suite), "-i", str(path)],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert res.returncode == 2, res
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "host 'd': key 'image'" in lines[0] and "Traceback" not in res.stderr, res.stderr


def test_a_command_host_whose_tool_is_missing_is_that_hosts_failure(tmp_path: Path) -> None:
    cfg = load_inventory(_load(tmp_path, 'name = "c"\ntransport = "command"\nargv = ["crosshost-no-such-tool", "exec"]\n')).get("c")
    host = open_host(cfg)
    assert isinstance(host, CommandHost)
    from orchestrator.errors import HostUnreachable

    with pytest.raises(HostUnreachable, match="cannot run crosshost-no-such-tool") as err:
        host.exec(["true"], 5)
    assert err.value.host == "c" and err.value.exit_code == 3


def test_a_prefix_that_does_not_reach_a_shell_is_the_hosts_failure_not_an_exit_code(tmp_path: Path) -> None:
    # `false` stands for a tool that fails before the host's shell runs (no such container, pod, pid)
    cfg = load_inventory(_load(tmp_path, 'name = "c"\ntransport = "command"\nargv = ["sh", "-c", "echo no such pod >&2; exit 1", "x"]\n')).get("c")
    from orchestrator.errors import HostUnreachable

    with open_host(cfg) as host, pytest.raises(HostUnreachable, match="did not reach the host: no such pod"):
        host.exec(["true"], 5)
