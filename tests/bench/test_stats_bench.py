"""make bench's statistics: the simulations with fixed seeds run and their table reads them."""

from __future__ import annotations

from bench.stats_bench import markdown, measure


def test_measure_and_markdown_on_a_few_runs() -> None:
    stats = measure(runs=4, seed=3)
    for key in ("error_rates_repeat_8", "error_rates_repeat_16"):
        assert set(stats[key]) == {"holm", "bh"}
        assert all(0 <= row["any_false_rate"] <= 1 and 0 <= row["power_90_10"] <= 1 for row in stats[key].values())
    u = stats["until_decided"]
    assert u["fixed_repeat_16"]["attempts_per_run"] == 16 * 3 * 200
    assert u["until_decided_max_32"]["attempts_per_run"] < u["fixed_repeat_16"]["attempts_per_run"]
    table = "\n".join(markdown(stats))
    assert "| --repeat 8 | holm | 4 |" in table and "| attempt ratio |" in table
    assert markdown(None) == []
