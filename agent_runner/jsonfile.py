"""Read one JSON input file, naming the file and what is wrong in the one error a user sees."""

from __future__ import annotations

import json
import os
from typing import Any, Type

from .errors import InputError


def read_json(path: "str | os.PathLike[str]", what: str, error: Type[InputError] = InputError) -> Any:
    """The parsed content of ``path``; ``error`` (exit 2) when it cannot be read or is not JSON."""
    name = os.fspath(path)
    try:
        with open(name, encoding="utf-8") as handle:
            return json.load(handle)
    except OSError as exc:
        raise error(f"{name}: cannot read {what}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise error(f"{name}: not valid JSON: {exc}") from exc
