"""The pinned agent CLIs (tools/agent-clis, installed into .agent-clis/ by ``make setup``), staged where
every test host and every uid can run them (tests/support/shared.py): one directory under /var/tmp
named by the pins, built once per version.

``cli(name)`` is the program a preset's ``command`` starts (its argv[0]), checked to be the pinned
version; a missing install is a failure that says to run ``make setup``, never a skip.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.shared import _publish

REPO = Path(__file__).resolve().parents[2]
PINS = REPO / "tools" / "agent-clis"
INSTALLED = REPO / ".agent-clis"
MODULES = INSTALLED / "node_modules"

#: preset -> (what make setup installed, where it goes in the staged directory, its argv[0] there,
#: the version it must say)
_CODEX = "@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl"


def _versions() -> dict[str, str]:
    npm = json.loads((PINS / "package.json").read_text())["dependencies"]
    mini = next(line.strip().split("==")[1] for line in (PINS / "mini-swe-agent.txt").read_text().splitlines()
                if line.startswith("mini-swe-agent=="))
    return {"codex": npm["@openai/codex"], "gemini-cli": npm["@google/gemini-cli"],
            "opencode": npm["opencode-linux-x64"], "mini-swe-agent": mini}


def _tag() -> str:
    h = hashlib.sha256()
    for name in ("package.json", "package-lock.json", "mini-swe-agent.txt"):
        h.update((PINS / name).read_bytes())
    return h.hexdigest()[:16]


def staged() -> Path:
    """The directory under /var/tmp holding every CLI but Claude Code (tests/integration/
    test_agent_cli_sshd.py stages that one): codex/, gemini-cli/, opencode, mini-swe-agent/."""
    if not (INSTALLED / ".installed").exists() or not (INSTALLED / "mini-swe-agent" / ".installed").exists():
        pytest.fail(f"the agent CLIs of tools/agent-clis are not installed in {INSTALLED}: run `make setup`",
                    pytrace=False)
    name = f"crosshost-agent-clis-{_tag()}"

    def build(into: Path) -> None:
        shutil.copytree(MODULES / _CODEX, into / "codex", symlinks=True)
        shutil.copytree(MODULES / "@google" / "gemini-cli", into / "gemini-cli", symlinks=True)
        shutil.copy2(MODULES / "opencode-linux-x64" / "bin" / "opencode", into / "opencode")
        shutil.copytree(INSTALLED / "mini-swe-agent", into / "mini-swe-agent", symlinks=True)
        # a moved venv keeps a working bin/python; its scripts name the old one
        mini = into / "mini-swe-agent" / "bin" / "mini"
        lines = mini.read_text().splitlines(keepends=True)
        mini.write_text(f"#!/var/tmp/{name}/mini-swe-agent/bin/python\n" + "".join(lines[1:]))
        subprocess.run(["chmod", "-R", "a+rX", str(into)], check=True)

    return _publish(name, build)


def cli(preset: str) -> str:
    """argv[0] of ``preset``'s CLI, staged, after checking it runs the pinned version."""
    root = staged()
    program = {"codex": root / "codex" / "bin" / "codex", "gemini-cli": root / "gemini-cli" / "bundle" / "gemini.js",
               "opencode": root / "opencode", "mini-swe-agent": root / "mini-swe-agent" / "bin" / "mini"}[preset]
    want = _versions()[preset]
    if preset == "mini-swe-agent":
        probe = [str(root / "mini-swe-agent" / "bin" / "python"), "-c",
                 "import importlib.metadata as m; print(m.version('mini-swe-agent'))"]
    else:
        probe = [str(program), "--version"]
    said = subprocess.run(probe, capture_output=True, text=True, timeout=120).stdout
    if want not in said.split() and not said.strip().endswith(want):
        pytest.fail(f"{program} says {said.strip()!r}, not the pinned {want}: rerun `make setup`", pytrace=False)
    return str(program)
