"""tools/setupcache.py: what make setup copies instead of installing again is the entry of exactly the
pins it was installed from, lands whole at the new place, and names the new place, not the old one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "tools" / "setupcache.py"


def _run(cache: Path, *args: str, python: str = "/usr/bin/python3") -> subprocess.CompletedProcess[str]:
    return subprocess.run([python, str(TOOL), *args], capture_output=True, text=True,
                          env={"CROSSHOST_SETUP_CACHE": str(cache), "PATH": "/usr/bin:/bin"})


def test_a_venv_is_restored_for_the_same_pins_only_and_names_its_new_place(tmp_path: Path) -> None:
    cache, pins = tmp_path / "cache", tmp_path / "pins.txt"
    pins.write_text("a==1\n")
    old = tmp_path / "one" / "venv"
    (old / "bin").mkdir(parents=True)
    (old / "bin" / "tool").write_text(f"#!{old}/bin/python\nprint('hi')\n")
    (old / "bin" / "tool").chmod(0o755)
    (old / "bin" / "native").write_bytes(b"\x7fELF\0" + str(old).encode())
    (old / "bin" / "python").symlink_to("/usr/bin/python3")
    (old / "pyvenv.cfg").write_text(f"home = /usr/bin\ncommand = /usr/bin/python3 -m venv {old}\n")
    new = tmp_path / "two words" / "venv"
    assert _run(cache, "restore", "v", str(new), str(pins), "--key-text", "py1").returncode == 1
    assert not new.exists()
    assert _run(cache, "store", "v", str(old), str(pins), "--key-text", "py1").returncode == 0
    # another interpreter or other pins: another key, nothing to copy
    assert _run(cache, "restore", "v", str(new), str(pins), "--key-text", "py2").returncode == 1
    pins.write_text("a==2\n")
    assert _run(cache, "restore", "v", str(new), str(pins), "--key-text", "py1").returncode == 1
    pins.write_text("a==1\n")
    done = _run(cache, "restore", "v", str(new), str(pins), "--key-text", "py1")
    assert done.returncode == 0, done.stderr
    # a shebang cannot name a path with a space: the /bin/sh lines pip writes for one, and it runs
    assert (new / "bin" / "tool").read_text() == (
        "#!/bin/sh\n" + f"'''exec' \"{new}/bin/python\" \"$0\" \"$@\"\n" + "' '''\nprint('hi')\n")
    ran = subprocess.run([str(new / "bin" / "tool")], capture_output=True, text=True)
    assert (ran.returncode, ran.stdout) == (0, "hi\n"), ran.stderr
    assert (new / "bin" / "tool").stat().st_mode & 0o777 == 0o755
    assert (new / "bin" / "native").read_bytes() == b"\x7fELF\0" + str(old).encode()  # a binary keeps its bytes
    assert (new / "bin" / "python").readlink() == Path("/usr/bin/python3")
    assert str(new) in (new / "pyvenv.cfg").read_text() and str(old) not in (new / "pyvenv.cfg").read_text()
    assert sorted(p.name for p in new.iterdir()) == ["bin", "pyvenv.cfg"]  # no bookkeeping left behind
    assert (old / "bin" / "tool").read_text().startswith(f"#!{old}/")  # the cache's own copy untouched
    plain = tmp_path / "three" / "venv"  # a place a shebang can name keeps its plain first line
    assert _run(cache, "restore", "v", str(plain), str(pins), "--key-text", "py1").returncode == 0
    assert (plain / "bin" / "tool").read_text() == f"#!{plain}/bin/python\nprint('hi')\n"
    assert sorted(p.name for p in cache.iterdir()) == [next(cache.iterdir()).name]  # one entry, no temporaries


def test_satisfied_says_which_requirement_the_installed_packages_do_not_meet() -> None:
    ok = _run(Path("/nonexistent"), "satisfied", "pytest", python=sys.executable)
    assert ok.returncode == 0, ok.stderr
    old = _run(Path("/nonexistent"), "satisfied", "pytest>=9999", python=sys.executable)
    assert old.returncode == 1 and "unmet: pytest>=9999 (installed:" in old.stderr
    missing = _run(Path("/nonexistent"), "satisfied", "crosshost-no-such-package", python=sys.executable)
    assert missing.returncode == 1 and "unmet: crosshost-no-such-package (not installed)" in missing.stderr


def test_a_store_keeps_only_the_entries_of_its_name_used_last(tmp_path: Path) -> None:
    """A new lock's entry is a GB for the agent CLIs: storing it removes that name's entries but the
    two stored or restored last; other names' entries stay."""
    cache, pins, src = tmp_path / "cache", tmp_path / "pins.txt", tmp_path / "src"
    src.mkdir()
    (src / "f").write_text("x")

    def store(name: str, pin: str) -> None:
        pins.write_text(pin)
        assert _run(cache, "store", name, str(src), str(pins)).returncode == 0

    def entries() -> dict[str, str]:
        return {p.name: (p / "f").read_text() for p in cache.iterdir()}

    store("v", "a==1\n")
    first = set(entries())
    store("v", "a==2\n")
    second = set(entries()) - first
    store("w", "a==1\n")  # another name: never counted with v's
    pins.write_text("a==1\n")
    assert _run(cache, "restore", "v", str(tmp_path / "dest"), str(pins)).returncode == 0  # a==1 used again
    store("v", "a==3\n")
    kept = set(entries())
    assert first <= kept and not second & kept  # a==2 was used last longest ago
    assert len([n for n in kept if n.startswith("v-")]) == 2 and len([n for n in kept if n.startswith("w-")]) == 1
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]  # nothing half-removed left
    pins.write_text("a==2\n")
    gone = _run(cache, "restore", "v", str(tmp_path / "dest"), str(pins))
    assert gone.returncode == 1 and "no v cached" in gone.stderr
