"""The controller's check of what a host sent: digests announced over the channel, verdicts re-derived."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path, PurePosixPath

import pytest

from agent_runner.digests import MARKER
from orchestrator.errors import OutputTampered
from orchestrator.hosts.archive import read_archive
from orchestrator.hosts.integrity import tampered_files, verify_host_output

ROW = {"task": "t", "env": "h", "attempt": 0, "verdict": "fail", "reason": "stop", "run_id": "r",
       "env_sha": "e", "exit_code": 1, "wall_ms": 1, "fingerprint": "f", "why": "predicate exited 1"}  # fmt: skip
FINISH = {"type": "finish", "reason": "stop", "final": "", "predicate_exit": 1, "verdict": "fail",
          "why": "predicate exited 1", "wall_ms": 1, "steps": 0, "findings": []}  # fmt: skip


PASS_ROW = {**ROW, "verdict": "pass", "exit_code": 0, "why": "ok"}
PASS = {**FINISH, "verdict": "pass", "predicate_exit": 0, "why": "ok"}


def _host_dir(tmp_path: Path, row: dict, finish: dict) -> tuple[Path, list[PurePosixPath], str]:
    """A pulled host directory and the stdout of a runner that announced exactly these files."""
    files = {
        "results.jsonl": json.dumps(row) + "\n",
        "traces/t.0.jsonl": json.dumps({"type": "header", "task": "t", "attempt": 0}) + "\n" + json.dumps(finish) + "\n",
    }
    said = []
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
        said.append(f"{MARKER} {hashlib.sha256(text.encode()).hexdigest()} {rel}")
    return tmp_path, [PurePosixPath(r) for r in files], "\n".join(said) + "\n"


def test_files_as_announced_and_verdicts_borne_out_pass(tmp_path: Path) -> None:
    verify_host_output("h", *_host_dir(tmp_path, ROW, FINISH))


def test_a_changed_or_unannounced_file_is_the_hosts_error_and_set_aside(tmp_path: Path) -> None:
    host_dir, pulled, stdout = _host_dir(tmp_path, ROW, FINISH)
    (host_dir / "traces" / "t.0.jsonl").write_text(json.dumps({**FINISH, "verdict": "pass"}) + "\n")
    (host_dir / "traces" / "u.0.jsonl").write_text("{}\n")
    with pytest.raises(OutputTampered, match=r"traces/t.0.jsonl differs from what the runner wrote \(2 problems"):
        verify_host_output("h", host_dir, [*pulled, PurePosixPath("traces/u.0.jsonl")], stdout)
    assert sorted(p.name for p in (host_dir / "traces").iterdir()) == ["t.0.jsonl.tampered", "u.0.jsonl.tampered"]


@pytest.mark.parametrize("first", [True, False])
def test_a_digest_announced_beside_the_runners_for_the_same_file_is_the_hosts_error(
    tmp_path: Path, first: bool
) -> None:
    """Whoever reaches the digests' channel (at ``none``, an attempt) and announces a digest of its own
    for a file the runner announces, before or after the runner's line, makes two digests for one
    file: the host's error, the file matching either one or not."""
    host_dir, pulled, stdout = _host_dir(tmp_path, PASS_ROW, PASS)
    forged_text = json.dumps({**PASS_ROW, "task": "t", "why": "forged"}) + "\n"
    (host_dir / "results.jsonl").write_text(forged_text)
    forged = f"{MARKER} {hashlib.sha256(forged_text.encode()).hexdigest()} results.jsonl\n"
    with pytest.raises(OutputTampered, match="results.jsonl was announced twice with different digests"):
        verify_host_output("h", host_dir, pulled, forged + stdout if first else stdout + forged)


@pytest.mark.parametrize(
    ("row", "finish", "said"),
    [
        ({**ROW, "verdict": "pass"}, FINISH, "verdict pass but its trace says fail"),
        ({**ROW, "verdict": "pass", "exit_code": 1}, {**FINISH, "verdict": "pass"}, "pass although the predicate exited 1"),
        ({**ROW, "exit_code": 0}, FINISH, "exit_code 0 but its trace's predicate exited 1"),
        (PASS_ROW, {**PASS, "findings": [{"kind": "host_path", "tool": "shell"}]}, "pass although its trace has contract findings"),
        # a field of a type the runner never writes is forged: never read as absent
        (PASS_ROW, {**PASS, "findings": "host_path"}, "has findings 'host_path', which the runner never writes"),
        ({**PASS_ROW, "exit_code": None}, {**PASS, "predicate_exit": "1"}, "has predicate_exit '1', which the runner"),
        ({**PASS_ROW, "exit_code": 1}, {**PASS, "predicate_exit": True}, "has predicate_exit True, which the runner"),
    ],
)
def test_a_row_its_trace_does_not_bear_out_is_an_error_never_a_pass(
    tmp_path: Path, row: dict, finish: dict, said: str
) -> None:
    """Even with every digest right (the runner itself lied): the controller re-derives the verdict."""
    with pytest.raises(OutputTampered, match=said):
        verify_host_output("h", *_host_dir(tmp_path, row, finish))


def test_a_pulls_own_digests_find_what_reading_every_file_back_finds(tmp_path: Path) -> None:
    """The pull hashes each file as it writes it (``read_archive``'s sha256s); the check then reads
    nothing back. On a host that changed, added and dropped files, both ways name the same problems."""
    sent = {"results.jsonl": b"row\n", "traces/t.0.jsonl": b"forged\n", "traces/u.0.jsonl": b"extra\n",
            "traces/t.0.obs.jsonl": b""}  # fmt: skip
    announced = {"results.jsonl": b"row\n", "traces/t.0.jsonl": b"real\n", "traces/t.0.obs.jsonl": b"",
                 "traces/gone.0.jsonl": b"x\n"}  # fmt: skip
    arc = tmp_path / "out.tar"
    with tarfile.open(arc, "w") as tar:
        for rel, data in sent.items():
            info = tarfile.TarInfo(f"./{rel}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    written: dict[PurePosixPath, str] = {}
    pulled = read_archive(arc, tmp_path / "h", host="h", sha256s=written)
    assert written == {p: hashlib.sha256((tmp_path / "h" / p).read_bytes()).hexdigest() for p in pulled}
    digests = {rel: hashlib.sha256(data).hexdigest() for rel, data in announced.items()}
    plain = tampered_files(tmp_path / "h", pulled, digests)  # every file read back and hashed
    assert tampered_files(tmp_path / "h", pulled, digests, written) == plain
    assert [rel for rel, _ in plain] == ["traces/t.0.jsonl", "traces/u.0.jsonl", "traces/gone.0.jsonl"]
