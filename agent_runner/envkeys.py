"""Environment keys the runner sets itself for every attempt (standard library only, Python 3.9).

An attempt gets a fresh, empty ``HOME`` and ``TMPDIR`` of its own and its workspace as ``PWD``,
whatever the inventory allowlists or pins for them; the controller says so once per run when an
inventory names them (``orchestrator.hosts.inventory.override_notes``).
"""

ATTEMPT_ENV_KEYS = ("HOME", "TMPDIR", "PWD")

# Variables that make a loader, a shell or an interpreter run code of their choosing before the
# runner's first line: refused in an inventory's env_allowlist and env unless allow_dangerous_env.
DANGEROUS_ENV_KEYS = (
    "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "LD_DEBUG_OUTPUT", "DYLD_INSERT_LIBRARIES",
    "DYLD_LIBRARY_PATH", "PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME", "PYTHONINSPECT", "PYTHONUSERBASE",
    "PYTHONBREAKPOINT", "BASH_ENV", "ENV", "IFS", "PS4", "SHELLOPTS", "BASHOPTS", "PROMPT_COMMAND",
    "GCONV_PATH", "NODE_OPTIONS", "PERL5LIB", "PERL5OPT", "RUBYLIB", "RUBYOPT", "MALLOC_CHECK_",
)


def is_dangerous_env_key(name: str) -> bool:
    """A loader-hijacking variable: one of ``DANGEROUS_ENV_KEYS``, or any ``LD_*`` / ``DYLD_*``."""
    return name in DANGEROUS_ENV_KEYS or name.startswith(("LD_", "DYLD_"))
