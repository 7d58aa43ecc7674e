"""A run's traces as frames of one file (``--trace-stream``) come home as the files the plain way writes:
the same bytes, the same digest lines; the controller splits them while reading the host's archive."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import threading
from pathlib import Path, PurePosixPath

import pytest

from agent_runner import paced
from agent_runner.trace import TraceWriter
from agent_runner.trace_stream import STREAM, StreamError, TraceStream, frames
from bench.gen_suite import generate_suite
from orchestrator.hosts.archive import read_archive
from orchestrator.hosts.integrity import announced

REPO = Path(__file__).resolve().parents[2]


def _announced(stdout: str) -> dict[str, str]:
    """The digest lines, read as the pull's integrity check reads them (none said twice)."""
    digests, problems = announced(stdout)
    assert problems == []
    return digests


def _attempts(out: Path, stream: TraceStream | None) -> None:
    """Three attempts' traces, the second and third written at once (two slots), one without turns."""

    def one(task: str, turns: int) -> None:
        trace = out / "traces" / f"{task}.0.jsonl"
        with TraceWriter(trace, trace.with_suffix(".obs.jsonl"), announce_under=out, stream=stream) as w:
            w.header(run_id="r", host="h", task=task, attempt=0, fingerprint="f" * 16, pins={"k": "é"})
            for i in range(turns):
                w.turn(tool="read", args={"path": f"{i}"}, observation="x" * (i * 997), error=None)
            w.finish(reason="stop", final="done", predicate_exit=0, verdict="pass", why="ok", wall_ms=1)

    one("a", 3)
    slots = [threading.Thread(target=one, args=(t, n)) for t, n in (("b", 40), ("c", 0))]
    for t in slots:
        t.start()
    for t in slots:
        t.join()


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _home(out: Path, dest: Path) -> dict[PurePosixPath, str]:
    """``out`` as the run exec packs it, read as a pull reads it (``read_archive``)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(out, arcname=".")
    sha256s: dict[PurePosixPath, str] = {}
    read_archive(Path("out.tar"), dest, host="h", sha256s=sha256s, data=buf.getvalue())
    return sha256s


def test_a_stream_comes_home_as_the_files_the_plain_way_writes(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    paced.flush_all()  # another test's digest lines still paced in this process are not this one's
    capfd.readouterr()
    plain, streamed = tmp_path / "plain", tmp_path / "streamed"
    (plain / "traces").mkdir(parents=True)
    (streamed / "traces").mkdir(parents=True)
    _attempts(plain, None)
    paced.flush_all()
    plain_said = _announced(capfd.readouterr().out)
    stream = TraceStream(streamed / STREAM)
    _attempts(streamed, stream)
    stream.close()
    paced.flush_all()
    streamed_said = _announced(capfd.readouterr().out)
    assert _files(streamed) == {STREAM: (streamed / STREAM).read_bytes()}  # nothing else on the host's disk
    sha256s = _home(streamed, tmp_path / "home")
    assert _files(tmp_path / "home") == _files(plain)  # byte for byte, the empty sidecar-less attempt too
    assert streamed_said == plain_said
    assert {str(k): v for k, v in sha256s.items()} == streamed_said  # what the pull's integrity check compares


def test_frames_of_two_slots_never_interleave_inside_one(tmp_path: Path) -> None:
    stream = TraceStream(tmp_path / STREAM)

    def write(name: str) -> None:
        for i in range(300):
            stream.write(f"traces/{name}.0.jsonl", (f"{name}{i} " * 300 + "\n").encode())

    threads = [threading.Thread(target=write, args=(n,)) for n in ("p", "q", "r")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stream.close()
    got: dict[str, bytes] = {}
    with open(tmp_path / STREAM, "rb") as fh:
        for name, piece in frames(fh):
            got[name] = got.get(name, b"") + piece
    for n in ("p", "q", "r"):
        assert got[f"traces/{n}.0.jsonl"] == b"".join((f"{n}{i} " * 300 + "\n").encode() for i in range(300))


@pytest.mark.parametrize("name", ["../x", "traces/../x", "results.jsonl", "traces/a b", "traces/", "/etc/x"])
def test_the_writer_refuses_a_name_outside_traces(tmp_path: Path, name: str) -> None:
    stream = TraceStream(tmp_path / STREAM)
    with pytest.raises(StreamError):
        stream.write(name, b"x")
    stream.close()
    assert (tmp_path / STREAM).read_bytes() == b""


def test_a_stream_cut_short_gives_what_was_written(tmp_path: Path) -> None:
    whole = b"traces/a.0.jsonl 4\nabcdtraces/b.0.jsonl 0\ntraces/a.0.jsonl 6\nefghij"
    assert [(n, p) for n, p in frames(io.BytesIO(whole))] == [
        ("traces/a.0.jsonl", b"abcd"), ("traces/b.0.jsonl", b""), ("traces/a.0.jsonl", b"efghij")]
    # a runner killed inside the last frame's bytes, or inside its header
    assert list(frames(io.BytesIO(whole[:-3])))[-1] == ("traces/a.0.jsonl", b"efg")
    assert list(frames(io.BytesIO(whole[: whole.rindex(b"\n") - 2])))[-1] == ("traces/b.0.jsonl", b"")


@pytest.mark.parametrize("bad", [b"traces/a.0.jsonl x\n", b"garbage\n", b"../x 1\nx", b"traces/a.0.jsonl\n",
                                 b"traces/a.0.jsonl " + b"9" * 300 + b"\n"])
def test_a_header_that_is_not_one_is_refused(bad: bytes) -> None:
    with pytest.raises(StreamError):
        list(frames(io.BytesIO(b"traces/ok.0.jsonl 1\nx" + bad)))


def test_a_real_run_with_its_traces_in_one_stream(tmp_path: Path) -> None:
    """The runner as crosshost starts it (``--trace-stream``): one trace file on the host, and every
    file it announced comes home with the digest it announced; the plain run's names, the same."""
    suite = generate_suite(tmp_path / "suite", 6, 0).root
    homes = {}
    for mode in ("plain", "stream"):
        out = tmp_path / mode / "out"
        env = {"PATH": os.environ.get("PATH", os.defpath), "PYTHONPATH": str(REPO)}
        done = subprocess.run(
            [sys.executable, "-m", "agent_runner", "run", "--suite", str(suite), "--out", str(out),
             "--workspace-root", str(tmp_path / mode / "ws"), "--host", "h",
             *(["--trace-stream"] if mode == "stream" else [])],
            env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        said = _announced(done.stdout)
        if mode == "stream":
            assert sorted(p.name for p in (out / "traces").iterdir()) == []
        sha256s = _home(out, tmp_path / mode / "home")
        assert {str(k): v for k, v in sha256s.items() if str(k) != STREAM} == said
        homes[mode] = sorted(_files(tmp_path / mode / "home"))
        assert all(hashlib.sha256((tmp_path / mode / "home" / k).read_bytes()).hexdigest() == v for k, v in said.items())
    assert homes["stream"] == homes["plain"]


def test_a_runner_killed_mid_run_still_sends_the_traces_it_streamed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay (local host, the real runner) whose runner the run's timeout kills in its third attempt's
    predicate: the first two attempts' traces come home whole from the stream; the third's header too."""
    from orchestrator.commands.replay import ReplayRequest, replay
    from orchestrator.hosts import host_job
    from tests.support.runner import write_suite

    stop = [{"content": "done", "finish": "stop"}]
    suite = write_suite(tmp_path / "suite", {
        "a-first": {"script": stop, "repo": {"run_tests.sh": "exit 0\n"}},
        "b-second": {"script": stop, "repo": {"run_tests.sh": "exit 0\n"}},
        "z-sleeper": {"script": stop, "repo": {"run_tests.sh": "sleep 60\nexit 0\n"}},
    })  # fmt: skip
    inventory = tmp_path / "hosts.toml"
    inventory.write_text(f'[[hosts]]\nname = "a"\ntransport = "local"\nworkspace_root = "{tmp_path}/root"\ntimeout_s = 10\n'
                         f'python = "{sys.executable}"\n')
    monkeypatch.setattr(host_job, "RUN_MARGIN_S", -26)  # timeout_s 10 x 3 attempts - 26: killed after 4 s
    out = replay(ReplayRequest(suite_dir=suite, inventory_path=inventory, out=tmp_path / "runs",
                               cache_dir=tmp_path / "cache"), with_analysis=False)  # fmt: skip
    rec = out.manifest.hosts["a"]
    assert out.exit_code == 3 and rec.error and "killed" in rec.error, rec.error
    traces = out.run_dir.path / "hosts" / "a" / "traces"
    for task in ("a-first", "b-second"):
        kinds = [json.loads(line)["type"] for line in (traces / f"{task}.0.jsonl").read_text().splitlines()]
        assert kinds[0] == "header" and kinds[-1] == "finish", (task, kinds)
    assert json.loads((traces / "z-sleeper.0.jsonl").read_text().splitlines()[0])["type"] == "header"
    assert not (out.run_dir.path / "hosts" / "a" / STREAM).exists()


def test_a_frame_that_fails_part_of_the_way_is_taken_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk in the middle of a frame (the attempt may fill it): the stream ends where it ended
    before, so the next frame is not read as the cut one's bytes and the others still come home."""
    import errno

    from agent_runner import trace_stream

    stream = TraceStream(tmp_path / STREAM)
    stream.write("traces/a.0.jsonl", b"first\n")
    real, calls = os.write, []

    def full_disk(fd: int, data: bytes) -> int:
        calls.append(len(data))
        if len(calls) == 1:
            return real(fd, bytes(data[:10]))  # part of the frame, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(trace_stream.os, "write", full_disk)
    with pytest.raises(OSError, match="No space"):
        stream.write("traces/b.0.jsonl", b"x" * 100)
    monkeypatch.setattr(trace_stream.os, "write", real)
    stream.write("traces/a.0.jsonl", b"second\n")  # space again
    stream.close()
    with open(tmp_path / STREAM, "rb") as fh:
        assert list(frames(fh)) == [("traces/a.0.jsonl", b"first\n"), ("traces/a.0.jsonl", b"second\n")]


def test_a_cut_frame_that_cannot_be_taken_back_ends_the_stream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from agent_runner import trace_stream

    stream = TraceStream(tmp_path / STREAM)
    real = os.write
    monkeypatch.setattr(trace_stream.os, "write", lambda fd, data: real(fd, bytes(data[:10])) if len(data) > 50
                        else (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
    monkeypatch.setattr(trace_stream.os, "ftruncate", lambda fd, n: (_ for _ in ()).throw(OSError(errno.EIO, "no")))
    with pytest.raises(OSError):
        stream.write("traces/b.0.jsonl", b"x" * 100)
    monkeypatch.setattr(trace_stream.os, "write", real)
    with pytest.raises(OSError):  # nothing lands inside the cut frame: it stays the last, read as far as it goes
        stream.write("traces/a.0.jsonl", b"later\n")
    stream.close()
    with open(tmp_path / STREAM, "rb") as fh:
        assert [n for n, _ in frames(fh)] in ([], ["traces/b.0.jsonl"])


def test_a_trace_whose_name_a_stream_cannot_carry_is_refused_before_it_writes(tmp_path: Path) -> None:
    stream = TraceStream(tmp_path / STREAM)
    with pytest.raises(StreamError):
        TraceWriter(tmp_path / "traces" / "bad\nname.0.jsonl", announce_under=tmp_path, stream=stream)
    stream.close()
    assert (tmp_path / STREAM).read_bytes() == b""


def test_a_task_id_with_a_trailing_newline_is_not_a_task_id() -> None:
    from agent_runner.suite import TASK_ID

    assert TASK_ID.match("task-1") and not TASK_ID.match("task-1\n")
