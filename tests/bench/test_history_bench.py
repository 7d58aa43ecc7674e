"""make bench's history row: a replay after its hosts measured with a short and a long index, and its table."""

from __future__ import annotations

from bench.history_bench import markdown, measure


def test_measure_and_markdown_on_a_small_index() -> None:
    out = measure(runs=5, tasks=4, reps=2)
    assert out["runs"] == 5 and out["one_run_median_ms"] > 0 and out["many_runs_median_ms"] > 0
    assert abs(out["ratio"] - out["many_runs_median_ms"] / out["one_run_median_ms"]) < 0.02
    table = "\n".join(markdown(out))
    assert "| index of 5 runs ms |" in table and f"{out['ratio']:.2f}×" in table
    assert markdown(None) == []
