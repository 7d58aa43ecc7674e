"""Environment keys the runner sets itself for every attempt (standard library only, Python 3.9).

An attempt gets a fresh, empty ``HOME`` and ``TMPDIR`` of its own and its workspace as ``PWD``,
whatever the inventory allowlists or pins for them; the controller says so once per run when an
inventory names them (``orchestrator.hosts.inventory.override_notes``).
"""

ATTEMPT_ENV_KEYS = ("HOME", "TMPDIR", "PWD")

# Variables that make a loader, a shell, an interpreter or a tool an attempt calls (git, ssh, a pager)
# run a command of their choosing: refused in an inventory's env_allowlist and env unless
# allow_dangerous_env.
DANGEROUS_ENV_KEYS = (
    "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "LD_DEBUG_OUTPUT", "DYLD_INSERT_LIBRARIES",
    "DYLD_LIBRARY_PATH", "PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME", "PYTHONINSPECT", "PYTHONUSERBASE",
    "PYTHONBREAKPOINT", "BASH_ENV", "ENV", "IFS", "PS4", "SHELLOPTS", "BASHOPTS", "PROMPT_COMMAND",
    "GCONV_PATH", "NODE_OPTIONS", "PERL5LIB", "PERL5OPT", "RUBYLIB", "RUBYOPT", "MALLOC_CHECK_",
    "EDITOR", "VISUAL", "PAGER", "MANPAGER", "LESSOPEN", "LESSCLOSE", "BROWSER",
)
#: prefixes and suffixes of command-running variables: every GIT_* (GIT_SSH_COMMAND, GIT_EXTERNAL_DIFF,
#: GIT_CONFIG_*, GIT_EXEC_PATH, GIT_PROXY_COMMAND, ...) and every *_ASKPASS (SSH_, SUDO_, GIT_ASKPASS)
_DANGEROUS_PREFIXES = ("LD_", "DYLD_", "GIT_")
_DANGEROUS_SUFFIXES = ("_ASKPASS", "_COMMAND", "_EDITOR", "_PAGER")


def is_dangerous_env_key(name: str) -> bool:
    """A variable that can make something run a command of its choosing: one of ``DANGEROUS_ENV_KEYS``,
    or any ``LD_*``, ``DYLD_*``, ``GIT_*``, ``*_ASKPASS``, ``*_COMMAND``, ``*_EDITOR``, ``*_PAGER``."""
    upper = name.upper()
    return (upper in DANGEROUS_ENV_KEYS or upper.startswith(_DANGEROUS_PREFIXES)
            or upper.endswith(_DANGEROUS_SUFFIXES))
