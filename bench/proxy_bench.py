"""The model proxy under load: what it adds to each request, how many streamed answers it relays at
once, and its memory per stream.

Three processes, so each one's CPU and memory are its own: the scripted provider
(``tests/support/fake_provider.py``), the proxy started as a replay starts it for a host
(``model_route`` of ``orchestrator/model/proxy.py``: a local host, an exec agent's ``[agent]``, the
real key in the proxy's environment, each request with its attempt's placeholder), and this process,
the client (``http.client``, one connection per request as the proxy's HTTP/1.0 serves it).

- Latency: ``requests`` pairs of the same request, once straight to the provider and once through the
  proxy, interleaved so the machine's load drifts alike for both; the added latency is each pair's
  difference (median and p99). Three kinds: the built-in agent's chat request, an exec agent's
  non-streamed and its streamed request (the answer's text in ``pieces`` events).
- Concurrency: for each K, K streamed answers started at once through a fresh proxy (each ``bytes``
  of text in ``pieces`` events ``delay_s`` apart, so they overlap); every stream is checked complete
  and in order (its text as sent, ``[DONE]`` last), none lost (refused, cut) or stalled (no byte for
  ``stall_s``, or not done within ``deadline_s``). The proxy's RSS is sampled during the wave: its
  growth over the idle proxy, per stream.

``python -m bench.proxy_bench [--requests N] [--streams 64,128,256,512]`` prints the numbers as
JSON; ``make bench`` runs it with the defaults and keeps them in its results.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from agent_runner.wire import ATTEMPT_HEADER, EXEC_PREFIX, MODEL_PASS_ENV, MODEL_URL_ENV, attempt_token

REPO = Path(__file__).resolve().parent.parent
KEY_ENV = "CROSSHOST_BENCH_PROVIDER_KEY"
KEY = "sk-bench-provider-key"
MODEL = "fake-model-1"
CHAT = "/v1/chat/completions"
STREAMS = (64, 128, 256, 512)
#: the targets: what the proxy may add per request (median), and the streams it must relay at once
TARGET_ADDED_MS = 2.0
TARGET_STREAMS = 256
#: how long the provider holds a stream after its first event for the others of its wave: less than
#: ``stall_s``, so when some never come (lost) the rest go on and are counted, not stalled by the hold
HOLD_S = 15.0
KINDS = ("chat", "exec", "exec_stream")


# -- the two children ------------------------------------------------------------------------


def serve_provider(bytes_: int, pieces: int, delay_s: float, hold: int, out: TextIO) -> None:
    """The scripted provider: every answer ``bytes_`` of text (``pieces`` events when streamed). With
    ``hold``, each stream waits after its first event until ``hold`` streams have sent theirs: that
    many are then open at once, end to end."""
    from tests.support.fake_provider import FakeProvider

    provider = FakeProvider(script=[{"content": answer_text(bytes_), "finish": "stop"}], key=KEY, model=MODEL,
                            stream_pieces=pieces, event_delay_s=delay_s, record=False)
    if hold:
        gate = threading.Barrier(hold)

        def all_started() -> bool:
            try:
                gate.wait(HOLD_S)
            except threading.BrokenBarrierError:
                return False  # some never came: the rest go on rather than wait forever
            return True

        provider.after_first_event = all_started
    with provider:
        out.write(provider.base_url + "\n")
        out.flush()
        sys.stdin.read()  # until the bench closes our stdin


def serve_proxy(base_url: str, out: TextIO, record_dir: Path) -> None:
    """The proxy as a replay starts it for one host: ``model_route`` with an exec agent's settings."""
    from orchestrator.hosts.transport.local import LocalHost
    from orchestrator.model.proxy import ProxyConfig, model_route

    agent = ProxyConfig(base_url, KEY_ENV, api="openai", kind="exec", model=MODEL)
    with model_route(LocalHost("bench"), agent, record_dir, None, "bench") as env:
        out.write(json.dumps(env) + "\n")
        out.flush()
        sys.stdin.read()


def answer_text(size: int) -> str:
    """``size`` characters of numbered marks: a piece out of order or missing changes the text."""
    marks = "".join(f"<{i:06d}>" for i in range(size // 8 + 1))
    return marks[:size]


@dataclass
class Child:
    proc: subprocess.Popen[str]
    line: str

    @property
    def pid(self) -> int:
        return self.proc.pid


@contextlib.contextmanager
def child(*argv: str) -> Iterator[Child]:
    """``python -m bench.proxy_bench <argv>`` until the block ends: its first stdout line is its address."""
    env = {**os.environ, KEY_ENV: KEY, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "bench.proxy_bench", *argv], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=REPO, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if not line:
            raise RuntimeError(f"bench.proxy_bench {argv[0]} did not start (exit {proc.wait(10)})")
        yield Child(proc, line)
    finally:
        with contextlib.suppress(OSError):
            assert proc.stdin is not None
            proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- the client ---------------------------------------------------------------------------------


@dataclass
class Target:
    """Where a request goes: the provider with the real key, or the proxy with an attempt's placeholder."""

    host: str
    port: int
    secret: str | None = None  # the proxy's runner secret; None: the provider itself

    def request(self, kind: str, n: int) -> tuple[str, dict[str, str]]:
        if self.secret is None:
            return CHAT, {"Authorization": f"Bearer {KEY}"}
        attempt = f"bench.{n}"
        auth = {"Authorization": f"Bearer {attempt_token(self.secret, attempt)}"}
        if kind == "chat":
            return CHAT, {**auth, ATTEMPT_HEADER: attempt}
        return f"{EXEC_PREFIX}{attempt}{CHAT}", auth


def target_of(url: str, secret: str | None = None) -> Target:
    hostport = url.split("//", 1)[1].split("/", 1)[0]
    host, _, port = hostport.partition(":")
    return Target(host, int(port), secret)


class Lost(Exception):
    """A request whose answer did not arrive whole (the reason is the message)."""


def call(target: Target, kind: str, n: int, expected: str, *, stall_s: float = 30.0) -> tuple[float, float]:
    """One request; (seconds to its first body byte, seconds to its last), after checking the answer."""
    stream = kind == "exec_stream"
    path, headers = target.request(kind, n)
    body = json.dumps({"model": MODEL, "stream": stream,
                       "messages": [{"role": "user", "content": f"request {n}: answer at length"}]}).encode()
    started = time.perf_counter()
    conn = http.client.HTTPConnection(target.host, target.port, timeout=stall_s)
    try:
        conn.request("POST", path, body, {**headers, "Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise Lost(f"HTTP {resp.status}: {resp.read(300)!r}")
        first = resp.read(1)
        first_s = time.perf_counter() - started
        data = first + resp.read()
        done_s = time.perf_counter() - started
    except TimeoutError:
        raise Lost(f"stalled: no byte for {stall_s:g} s") from None
    except (OSError, http.client.HTTPException) as exc:
        raise Lost(f"{type(exc).__name__}: {exc}") from None
    finally:
        conn.close()
    text = streamed_text(data) if stream else json.loads(data)["choices"][0]["message"]["content"]
    if text != expected:
        raise Lost(f"answer text differs ({len(text)} of {len(expected)} characters)")
    return first_s, done_s


def streamed_text(data: bytes) -> str:
    """The text of a chat completion's server-sent events; ``Lost`` unless ``[DONE]`` ends them."""
    text, done = [], False
    for line in data.decode().splitlines():
        if not line.startswith("data: "):
            continue
        if done:
            raise Lost("an event after [DONE]")
        payload = line[6:]
        if payload == "[DONE]":
            done = True
            continue
        for choice in json.loads(payload).get("choices") or []:
            text.append(choice.get("delta", {}).get("content") or "")
    if not done:
        raise Lost("the stream ended before [DONE]")
    return "".join(text)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def latency(provider: Target, proxy: Target, kind: str, requests: int, expected: str) -> dict[str, Any]:
    """``requests`` interleaved pairs, direct and proxied (which goes first alternates)."""
    for n in range(5):  # warm both sides (imports, first connections)
        call(provider, kind, n, expected)
        call(proxy, kind, n, expected)
    direct, proxied = [], []
    for n in range(requests):
        order = (provider, proxy) if n % 2 else (proxy, provider)
        got = {id(t): call(t, kind, 1000 + n, expected)[1] for t in order}
        direct.append(got[id(provider)])
        proxied.append(got[id(proxy)])
    added = [p - d for p, d in zip(proxied, direct, strict=True)]
    return {"requests": requests, "direct_median_ms": ms(statistics.median(direct)),
            "proxied_median_ms": ms(statistics.median(proxied)),
            "added_median_ms": ms(statistics.median(added)), "added_p99_ms": ms(percentile(added, 99)),
            "direct_p99_ms": ms(percentile(direct, 99)), "proxied_p99_ms": ms(percentile(proxied, 99))}


def status_kb(pid: int) -> dict[str, int]:
    """VmRSS (KiB) and Threads of a process."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "Threads"):
                out[key] = int(value.split()[0])
    return out


def wave(proxy: Target, pid: int, k: int, expected: str, stall_s: float, deadline_s: float) -> dict[str, Any]:
    """K streamed answers at once through the proxy; each checked; the proxy's RSS sampled meanwhile."""
    call(proxy, "exec", 0, expected)  # an idle proxy that has served a request (not a stream: the provider
    # holds each stream until the wave's K have started)
    idle = status_kb(pid)
    peak = dict(idle)
    results: list[tuple[float, float, float] | str] = [""] * k
    gate = threading.Barrier(k + 1)
    sampling = threading.Event()

    def one(i: int) -> None:
        gate.wait()
        t0 = time.perf_counter()
        try:
            first, done = call(proxy, "exec_stream", i + 1, expected, stall_s=stall_s)
        except Lost as exc:
            results[i] = str(exc)[:200]
            return
        results[i] = (t0, t0 + first, t0 + done)

    def sample() -> None:
        while not sampling.is_set():
            with contextlib.suppress(OSError):
                now = status_kb(pid)
                for key in peak:
                    peak[key] = max(peak[key], now.get(key, 0))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(k)]
    for t in threads:
        t.start()
    started = time.perf_counter()
    gate.wait()
    for t in threads:
        t.join(max(0.0, deadline_s - (time.perf_counter() - started)))
    sampling.set()
    sampler.join()
    finished = [r for r in results if isinstance(r, tuple)]
    late = [r for r in finished if r[2] - started > deadline_s]
    failed = [r for r in results if isinstance(r, str) and r]
    lost = [r for r in failed if not r.startswith("stalled")]
    stalled = sum(1 for t in threads if t.is_alive()) + len(late) + len(failed) - len(lost)
    # how many streams were open at the same moment (requested to last byte; not from the first byte:
    # a busy client may read a first byte that waited in its socket after another stream ended)
    edges = sorted([(r[0], 1) for r in finished] + [(r[2], -1) for r in finished])
    overlap = high = 0
    for _, step in edges:
        overlap += step
        high = max(high, overlap)
    growth_kb = peak["VmRSS"] - idle["VmRSS"]
    return {
        "streams": k, "complete": len(finished) - len(late), "lost": len(lost),
        "stalled": stalled, "lost_reasons": sorted(set(failed))[:5],
        "peak_overlap": high,
        "first_byte_p50_ms": ms(statistics.median([r[1] - r[0] for r in finished])) if finished else None,
        "slowest_s": round(max(r[2] - started for r in finished), 3) if finished else None,
        "proxy_threads_peak": peak["Threads"], "proxy_rss_idle_mb": round(idle["VmRSS"] / 1024, 1),
        "proxy_rss_peak_mb": round(peak["VmRSS"] / 1024, 1), "rss_per_stream_kb": round(growth_kb / k, 1),
    }


def measure(requests: int = 300, streams: tuple[int, ...] = STREAMS, *, text_bytes: int = 4096, pieces: int = 16,
            delay_s: float = 0.02, stall_s: float = 30.0, deadline_s: float = 120.0) -> dict[str, Any]:
    expected = answer_text(text_bytes)
    out: dict[str, Any] = {"text_bytes": text_bytes, "pieces": pieces, "delay_s": delay_s,
                           "stall_s": stall_s, "deadline_s": deadline_s, "loadavg_at_start": _load()}
    with tempfile.TemporaryDirectory(prefix="crosshost-proxy-bench-") as scratch:
        records = Path(scratch)
        with child("provider", str(text_bytes), str(pieces), "0", "0") as prov, \
                child("proxy", prov.line, str(records / "latency")) as prox:
            env = json.loads(prox.line)
            provider, proxy = target_of(prov.line), target_of(env[MODEL_URL_ENV], env[MODEL_PASS_ENV])
            out["latency"] = {kind: latency(provider, proxy, kind, requests, expected) for kind in KINDS}
        out["waves"] = []
        for k in streams:  # a fresh provider and proxy per wave
            with child("provider", str(text_bytes), str(pieces), str(delay_s), str(k)) as prov, \
                    child("proxy", prov.line, str(records / f"k{k}")) as prox:
                env = json.loads(prox.line)
                proxy = target_of(env[MODEL_URL_ENV], env[MODEL_PASS_ENV])
                out["waves"].append(wave(proxy, prox.pid, k, expected, stall_s, deadline_s))
    added = [row["added_median_ms"] for row in out["latency"].values()]
    whole = [w["streams"] for w in out["waves"] if w["complete"] == w["streams"]]
    out["max_added_median_ms"] = max(added)
    out["max_streams_whole"] = max(whole) if whole else 0
    out["targets"] = {"added_median_le_2ms": max(added) <= TARGET_ADDED_MS,
                      f"streams_{TARGET_STREAMS}_none_lost": out["max_streams_whole"] >= TARGET_STREAMS}
    out["met"] = all(out["targets"].values())
    out["loadavg_at_end"] = _load()
    return out


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def markdown(result: dict[str, Any] | None) -> list[str]:
    """The numbers as make bench's Markdown tables (nothing when skipped)."""
    if not result:
        return []
    lat = result["latency"]
    n = next(iter(lat.values()))["requests"]
    lines = ["", f"| proxy: added latency ({n} interleaved pairs) | direct median ms | proxied median ms "
             "| added median ms | added p99 ms | ≤2 ms median |", "|---|---|---|---|---|---|"]
    names = {"chat": "built-in agent, chat", "exec": "exec agent, not streamed",
             "exec_stream": f"exec agent, streamed ({result['pieces']} events)"}
    for kind, row in lat.items():
        lines.append(f"| {names.get(kind, kind)} | {row['direct_median_ms']:.2f} | {row['proxied_median_ms']:.2f} "
                     f"| {row['added_median_ms']:.2f} | {row['added_p99_ms']:.2f} "
                     f"| {_mark(row['added_median_ms'] <= TARGET_ADDED_MS)} |")
    lines += ["", f"| proxy: K streams at once ({result['text_bytes']} B in {result['pieces']} events, "
              f"{result['delay_s'] * 1000:.0f} ms apart) | complete | lost | stalled | peak overlap | slowest s "
              "| proxy threads | proxy RSS idle → peak MB | RSS per stream KB |",
              "|---|---|---|---|---|---|---|---|---|"]
    for w in result["waves"]:
        lines.append(f"| K = {w['streams']} | {w['complete']} | {w['lost']} | {w['stalled']} | {w['peak_overlap']} "
                     f"| {w['slowest_s'] if w['slowest_s'] is not None else '—'} | {w['proxy_threads_peak']} "
                     f"| {w['proxy_rss_idle_mb']} → {w['proxy_rss_peak_mb']} | {w['rss_per_stream_kb']} |")
    lines.append(f"| ≥{TARGET_STREAMS} streams, none lost | {_mark(result['targets'][f'streams_{TARGET_STREAMS}_none_lost'])} "
                 "| | | | | | | |")
    return lines


def _mark(ok: bool) -> str:
    return "met" if ok else "MISSED"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["provider"]:
        serve_provider(int(args[1]), int(args[2]), float(args[3]), int(args[4]), sys.stdout)
        return 0
    if args[:1] == ["proxy"]:
        serve_proxy(args[1], sys.stdout, Path(args[2]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="interleaved pairs per kind of request")
    parser.add_argument("--streams", type=lambda s: tuple(int(x) for x in s.split(",") if x), default=STREAMS)
    parser.add_argument("--markdown", action="store_true", help="the tables instead of the JSON")
    parsed = parser.parse_args(args)
    result = measure(parsed.requests, parsed.streams)
    if parsed.markdown:
        print("\n".join(markdown(result)))
    else:
        json.dump(result, sys.stdout, indent=2)
        sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
