"""The runner's word that no process of any attempt is left, as a file in the workspace (``--reaped``):
the workspace's removal then does not scan the host's processes for the run's
(``orchestrator/hosts/remote.py``, ``remove_script``). Standard library only, Python 3.9.
"""

from __future__ import annotations

import contextlib
import os

from . import privs


def no_child_left() -> bool:
    """This process has no child: none running, none ended and not yet waited for (nothing is reaped
    here). Where waitid is missing, False."""
    waitid = getattr(os, "waitid", None)
    if waitid is None:
        return False
    try:
        waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    except OSError:
        return False
    return False


def leave_reaped_mark(path: str, own_uids: bool) -> bool:
    """Make ``path`` (a new file) when no process of any attempt can be left, and only then (a file of
    that name made by anyone else is removed first). ``own_uids``: the run was ``pidns+uid`` and every
    attempt ran as a uid of its own. Every process such an attempt started is in a PID namespace whose
    init is this runner's child (its own fork, or a zygote) or its child's child (through a holder, or a
    zygote forked by the runner's first fork, which the run's end waits for),
    and the kernel ends every process of a namespace before its init can be waited for. As root the
    runner is its descendants' subreaper (``make_subreaper``): an orphan becomes its child, not init's.
    So once this runner has no child left, none is. The workspace's removal then does not scan the
    host's processes for the run's (``remote.remove_script``); an attempt, with a uid of its own, cannot
    make the file in the workspace's top directory (root's)."""
    with contextlib.suppress(OSError):
        os.unlink(path)
    if not own_uids or not privs.is_subreaper() or not no_child_left():
        return False
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
    except OSError:
        return False
    return True
