"""remote.clean_env_command through a real shell: the runner's environment is exactly the allowlist.

Pinned values come from the pins file, shell-quoted literals (a value with `$(...)`, quotes or a
newline is passed as it is and never runs), never from the command line; unpinned allowlisted keys
take the host's own value, and only when it has one.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from orchestrator.hosts import remote

# coreutils env, not Python: Python itself may add LC_CTYPE (PEP 538 locale coercion)
DUMP_ENV = ["env", "-0"]


def _env_seen(
    allowlist: list[str], pinned: dict[str, str], host_env: dict[str, str], tmp_path: Path
) -> dict[str, str]:
    pins = tmp_path / "pins.env"
    pins.write_text(remote.pins_text(pinned))
    cmd = remote.clean_env_command(allowlist, DUMP_ENV, pinned=list(pinned), pins_file=str(pins))
    for value in pinned.values():
        assert value not in cmd
    done = subprocess.run(["sh", "-c", cmd], env=host_env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return dict(item.split("=", 1) for item in done.stdout.split("\0") if item)


def test_pinned_values_with_shell_syntax_arrive_verbatim_and_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    value = f"a b '$(touch {marker})' \"q\" `touch {marker}` ; touch {marker}\nx $HOME"
    seen = _env_seen(["TZ", "LANG"], {"TZ": value, "LANG": "C.UTF-8"}, {"PATH": "/usr/bin:/bin"}, tmp_path)
    assert seen == {"TZ": value, "LANG": "C.UTF-8"}  # nothing else: the shell reading the file adds nothing
    assert not marker.exists()


def test_a_pinned_value_wins_over_the_hosts_own_and_the_rest_stay_the_hosts(tmp_path: Path) -> None:
    host_env = {"PATH": "/usr/bin:/bin", "TZ": "Europe/Paris", "LANG": "de_DE.UTF-8"}
    seen = _env_seen(["PATH", "LANG", "TZ"], {"TZ": "UTC"}, host_env, tmp_path)
    assert seen == {"PATH": "/usr/bin:/bin", "LANG": "de_DE.UTF-8", "TZ": "UTC"}


def test_pinned_keys_without_a_pins_file_are_refused() -> None:
    try:
        remote.clean_env_command(["TZ"], DUMP_ENV, pinned=["TZ"])
    except ValueError:
        return
    raise AssertionError("pinned keys without a pins file must be refused")


def test_only_allowlisted_keys_reach_the_command_with_the_hosts_own_values(tmp_path: Path) -> None:
    host_env = {"PATH": "/usr/bin:/bin", "LANG": "de_DE.UTF-8", "CROSSHOST_TEST_TOKEN": "tok-123", "HOME": "/h"}
    seen = _env_seen(["PATH", "LANG", "TZ"], {}, host_env, tmp_path)
    # TZ is allowlisted but the host has none: it stays unset (not set to the empty string)
    assert seen == {"PATH": "/usr/bin:/bin", "LANG": "de_DE.UTF-8"}
