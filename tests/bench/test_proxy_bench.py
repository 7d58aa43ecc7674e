"""make bench's model proxy rows: a real provider and a real proxy in processes of their own; what the
rows say (timing is make bench's, never asserted here)."""

from __future__ import annotations

import pytest

from bench import proxy_bench
from bench.proxy_bench import Lost, answer_text, markdown, measure, streamed_text


def test_more_streams_at_once_than_the_old_bounds_all_arrive_whole_and_the_rows_say_so() -> None:
    """300 streams held open at once through one proxy (past the 64 threads and the listen backlog of
    5 it once had): every one whole and in order, none lost or stalled, the proxy's memory measured."""
    out = measure(requests=3, streams=(300,))
    assert set(out["latency"]) == set(proxy_bench.KINDS)
    for row in out["latency"].values():
        assert row["requests"] == 3 and row["direct_median_ms"] > 0 and row["proxied_median_ms"] > 0
    (wave,) = out["waves"]
    assert wave["streams"] == wave["complete"] == wave["peak_overlap"] == 300, wave
    assert wave["lost"] == wave["stalled"] == 0 and wave["lost_reasons"] == []
    assert wave["proxy_threads_peak"] >= 300 and wave["proxy_rss_peak_mb"] >= wave["proxy_rss_idle_mb"] > 0
    assert out["max_streams_whole"] == 300 and out["targets"]["streams_256_none_lost"] is True
    table = "\n".join(markdown(out))
    assert "| K = 300 | 300 | 0 | 0 | 300 |" in table and "| exec agent, streamed (16 events) |" in table
    assert markdown(None) == []


def test_a_stream_cut_short_or_with_a_piece_missing_is_lost() -> None:
    text = answer_text(100)
    assert len(text) == 100 and text.startswith("<000000><000001>")
    pieces = [text[:40], text[40:]]
    events = [f'data: {{"choices": [{{"delta": {{"content": "{p}"}}}}]}}\n\n' for p in pieces]
    whole = "".join(events) + "data: [DONE]\n\n"
    assert streamed_text(whole.encode()) == text
    with pytest.raises(Lost, match="before \\[DONE\\]"):
        streamed_text("".join(events).encode())
    assert streamed_text((events[1] + "data: [DONE]\n\n").encode()) != text  # call() refuses it as lost
    with pytest.raises(Lost, match="after \\[DONE\\]"):
        streamed_text((whole + events[0]).encode())
