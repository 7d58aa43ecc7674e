"""Dotted keys: the one flattening pins moves (history), fingerprint diffs (repro) and attribution use."""

from __future__ import annotations

from orchestrator.dotted import flatten


def test_nested_objects_become_dotted_keys_and_lists_stay_leaves() -> None:
    fp = {"tz": {"TZ": "UTC", "tzname": ["UTC", "UTC"]}, "uid": 0, "locale": {}, "budget": {"a": {"b": None}}}
    assert flatten(fp) == {"tz.TZ": "UTC", "tz.tzname": ["UTC", "UTC"], "uid": 0, "budget.a.b": None}
    assert flatten(7) == {"": 7}
