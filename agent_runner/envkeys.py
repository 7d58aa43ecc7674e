"""Environment keys the runner sets itself for every attempt (standard library only, Python 3.9).

An attempt gets a fresh, empty ``HOME`` and ``TMPDIR`` of its own and its workspace as ``PWD``,
whatever the inventory allowlists or pins for them; the controller says so once per run when an
inventory names them (``orchestrator.inventory.override_notes``).
"""

ATTEMPT_ENV_KEYS = ("HOME", "TMPDIR", "PWD")
