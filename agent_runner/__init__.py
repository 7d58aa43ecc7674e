"""The crosshost runner: standard library only, travels to every host as one zipapp.

It must run on Python 3.9+, so no `X | Y` annotations evaluated at runtime, no `match`, no tomllib
without a fallback. It never imports `orchestrator`.
"""

__version__ = "0.1.0"
