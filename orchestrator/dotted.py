"""Nested JSON objects as flat ``a.b.c`` keys: how pins and fingerprints are compared and shown."""

from __future__ import annotations

from typing import Any


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}, "c": 2}`` -> ``{"a.b": 1, "c": 2}``; lists and scalars are leaves."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}
