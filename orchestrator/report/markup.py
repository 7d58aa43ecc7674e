"""Text safe inside ``report.html``: a value as escaped markup, data as JSON inside a ``<script>``.

Task ids, host names, arguments and observations come from the hosts and the agent, so nothing of
theirs is ever parsed as markup.
"""

from __future__ import annotations

import html
import json
from typing import Any


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)



def embed_json(data: Any) -> str:
    """JSON safe inside a ``<script>`` element: no ``<``, ``>`` or ``&`` survives as itself."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
