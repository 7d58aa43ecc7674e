"""The attempts' directories in memory: a tmpfs over the run's workspace root, mounted in a mount
namespace of the runner's own, so no other process of the host finds them at their path (root can
still look through ``/proc/<pid>/root``) and it goes when the run's last process does (a runner that
crashed leaves nothing in it behind). Its size is at most half the host's memory.

Why: every attempt makes and removes its directory, work, HOME and TMPDIR, and a run makes thousands.
On a disk file system each new inode may cost a search past the ones removed a moment ago (ext4
without a journal skips inodes deleted in the last minutes, one block lookup each); on a tmpfs it
costs nothing that grows. It is also what many hosts give already: their ``/tmp``, the default
``workspace_root``'s file system, is a tmpfs. The fingerprint's ``cwd_fs`` says which one a host's
attempts got.

Root only (the mount needs it), before the runner starts any thread (the namespace is the calling
thread's: every later thread and child shares it; a process with threads is refused), and only over
a workspace root that is new or empty (nothing of the host's is hidden). Anywhere it cannot be made,
the attempts' directories are on the workspace root's own file system, as with
``--attempts-on-disk``. Standard library only, Python 3.9.
"""

from __future__ import annotations

import contextlib
import os
import sys

from . import privs


def mount_over(root: str) -> bool:
    """Mount a private tmpfs over ``root`` (made, 711, when missing); True when the attempts' directories
    will be in memory. Nothing raised: False leaves them where they were."""
    if sys.platform != "linux" or os.geteuid() != 0:
        return False
    try:
        if len(os.listdir("/proc/self/task")) != 1:  # the other threads would stay where they are
            return False
        os.makedirs(os.path.dirname(os.path.abspath(root)), exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(root, 0o711)
            os.chmod(root, 0o711)  # whatever the umask: the attempts' uids pass through it, mounted or not
        if os.listdir(root):  # never hide what is there
            return False
        libc = privs.libc()
        privs._check(libc.unshare(privs._CLONE_NEWNS), "unshare")
        # its mounts reach no other namespace (the host's own keep reaching it)
        privs._check(libc.mount(None, b"/", None, privs._MS_REC | privs._MS_SLAVE, None), "mount --make-rslave /")
        # at most half the host's memory (the kernel's default, said here): the attempts' files are
        # memory another process cannot take back, as a disk's are space
        privs._check(libc.mount(b"tmpfs", os.fsencode(root), b"tmpfs", privs._MS_NOSUID | privs._MS_NODEV,
                                b"mode=0711,uid=0,gid=0,size=50%"), "mount tmpfs")
    except OSError:
        return False
    return True
