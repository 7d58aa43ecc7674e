"""report.html as a user opens it without crosshost's browser driver: a plain
``chromium --headless --screenshot report.html#task=NAME`` shows that task's view, and a trend whose
points coincide shows every point.

Never skipped: without Chromium these tests fail and say how to install it."""

from __future__ import annotations

import re
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from orchestrator.analysis import analyse_run
from orchestrator.report import write_reports
from orchestrator.report.trend import TrendPoint, trend_svg
from tests.support.html_run import build_known_run
from tools.headless import find_chromium

WIDTH, HEIGHT = 900, 700


def _chromium() -> str:
    found = find_chromium()
    if found is None:
        pytest.fail("no chromium on PATH: run `make setup` (it installs Debian's chromium) or apt-get install chromium")
    return found


def _plain(tmp_path: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Chromium as a user starts it: its own flags for a root container, nothing of tools/headless.py."""
    return subprocess.run(
        [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'profile'}",
         f"--window-size={WIDTH},{HEIGHT}", *args, url],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip


def _rows(png: bytes) -> list[bytes]:
    """The pixel rows (RGB or RGBA, 8 bits) of a non-interlaced PNG: enough to see where ink is."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, data, width, channels = 8, b"", 0, 0
    while pos < len(png):
        (length,) = struct.unpack(">I", png[pos : pos + 4])
        kind, body = png[pos + 4 : pos + 8], png[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, _, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and colour in (2, 6) and interlace == 0
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            data += body
        pos += 12 + length
    raw, stride, rows, prev = zlib.decompress(data), width * channels, [], bytearray(width * channels)
    for r in range(len(raw) // (stride + 1)):
        kind, line = raw[r * (stride + 1)], bytearray(raw[r * (stride + 1) + 1 : (r + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b, c = prev[i], prev[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + a) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + b) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        rows.append(bytes(line[j] for j in range(stride) if j % channels < 3))
        prev = line
    return rows


def _ink(row: bytes) -> int:
    """Dark pixels in a row (text)."""
    return sum(1 for i in range(0, len(row), 3) if row[i] + row[i + 1] + row[i + 2] < 200)


def test_a_plain_headless_screenshot_of_a_task_link_shows_that_tasks_view(tmp_path: Path) -> None:
    run = build_known_run(tmp_path / "runs")
    write_reports(run, analyse_run(run))
    url = (run / "report.html").as_uri() + "#task=flip-task"
    dom = _plain(tmp_path, url, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    section = re.search(r'<section id="task"[^>]*>(.*?)</section>', dom.stdout, re.S)
    assert section and "hidden" not in section.group(0).split(">", 1)[0], dom.stdout[-3000:]
    assert "<h2>flip-task</h2>" in section.group(1) and "local (ref) attempt 0" in section.group(1)
    shot = _plain(tmp_path, url, f"--screenshot={tmp_path / 'task.png'}")
    assert shot.returncode == 0, shot.stderr[-2000:]
    rows = _rows((tmp_path / "task.png").read_bytes())
    assert len(rows) == HEIGHT
    # the task view is at the top of what a screenshot catches, not below a blank viewport
    inked = [i for i, row in enumerate(rows) if _ink(row) > 3]
    assert inked and inked[0] < HEIGHT // 4, f"first text at row {inked[0] if inked else None}"
    assert sum(1 for i in inked if i < HEIGHT // 2) > 40


def test_points_of_one_run_that_coincide_are_drawn_apart() -> None:
    point = TrendPoint("r1", "2025-01-01T00:00:00Z", 0.0, {"local": 1.0, "box-b": 1.0, "box-c": 1.0})
    svg = trend_svg([point], "r1", 0.1, ["local", "box-b", "box-c"])
    circles = re.findall(r'<circle cx="([\d.]+)" cy="([\d.]+)" r="([\d.]+)"', svg)
    assert len(circles) == 4  # the flip rate and three hosts
    centres = [(float(cx), float(cy)) for cx, cy, _ in circles]
    # no dot sits on another one: every pair is at least a dot's diameter apart
    for i, (x1, y1) in enumerate(centres):
        for x2, y2 in centres[i + 1 :]:
            assert ((x1 - x2) ** 2 + (y1 - y2) ** 2) ** 0.5 >= 2 * float(circles[0][2]), centres
