"""Which isolation level this host gives a runner of this uid, found once per process by trying each,
and the sandbox an attempt gets at it (``sandbox`` starts the processes; this decides the level).

The strongest first: ``pidns+uid`` (root, with ``setpriv`` for a traced attempt), then ``pidns``, else
``none``; each with a network namespace of the attempt's own where the host gives one. One ``sh`` in
the level, using only its builtins, must pass ``probe_script``. ``detect_soon`` starts the probe on a
thread while the runner is still being imported; a one-slot root run has its slot's zygote run that
``sh`` instead (``answer_by_zygote``). Standard library only, Python 3.9.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from typing import Dict, List, Optional, Sequence

from . import zygote
from .launch import NONE, PIDNS, PIDNS_UID
from .sandbox import UID_BASE, UID_SPAN, Sandbox, reachable_by_others, system_tool

_PROBE_TIMEOUT_S = 10


def probe_script(level: str, net: bool, proc: str = "/proc") -> str:
    """The shell check a process at ``level`` passes only when it works: it sees a fresh ``proc``
    (its own few processes), with a uid of its own its effective uid is not root, and with ``net`` it
    sees no socket of the host (a fresh ``proc``/net: no TCP socket in use in ``sockstat``, one header
    line in ``unix``). Shell builtins only: a probe starts no program but ``sh`` (each one was a fork and
    an exec at every run). TCP is counted, not listed: the namespace's ``tcp`` table is read by walking
    the whole machine's (milliseconds). ``inuse`` is the namespace's own count (Linux 2.6.26+; ``tw``
    is the machine's before 4.x, and a namespace made for the probe holds no socket that could close)."""
    check = f'set -- {proc}/[0-9]*; test "$#" -le 3'
    if level == PIDNS_UID:  # Uid: real, effective, saved, file system
        check += (f' && u=0 && while read -r k r e s; do if test "$k" = Uid:; then u=$e; fi; done'
                  f' < {proc}/self/status && test "$u" != 0')
    if net:  # "TCP: inuse N orphan N tw N ...": the namespace's TCP sockets in use, 0
        check += (f' && t= && while read -r k a n r; do if test "$k" = TCP:; then t="$a $n"; fi; done'
                  f' < {proc}/net/sockstat && test "$t" = "inuse 0"'
                  f" && {{ ! {{ read -r l && read -r l; }}; }} < {proc}/net/unix")
    return check


def _works(level: str, net: bool = False) -> bool:
    """Try the level once (``probe_script``): a refusal is an answer (a kernel that allows no user
    namespace refuses one with ENOSPC every time), never tried again."""
    try:
        proc = Sandbox(level, UID_BASE + UID_SPAN - 1, net=net).popen(
            ["sh", "-c", probe_script(level, net)], again=False, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, env={"PATH": os.defpath})
    except OSError:
        return False
    try:
        return proc.wait(timeout=_PROBE_TIMEOUT_S) == 0
    except subprocess.TimeoutExpired:
        proc.kill_group()
        proc.wait()
        return False


_detected: Optional[str] = None
#: ``detect_soon``'s thread, and what it raised (raised again by the ``detect`` that waits for it)
_detecting: Optional[threading.Thread] = None
_detect_failed: List[BaseException] = []


def detect_soon() -> None:
    """Start ``detect(network=True)`` on a thread of its own: its probe's processes run while this
    process goes on (importing the runner, reading the suite); the next ``detect`` waits for it. A
    suite whose network is open uses only its level, the one ``detect()`` would find."""
    global _detecting
    if _detected is None and _detecting is None:
        def probe() -> None:
            try:
                detect(network=True)
            except BaseException as exc:  # noqa: B036 (raised again where it is waited for)
                _detect_failed.append(exc)

        _detecting = threading.Thread(target=probe, name="detect", daemon=True)
        _detecting.start()


def detect(network: bool = False) -> str:
    """The strongest level this host gives a runner of this uid (tried once per process). ``network``:
    the level is tried with a network namespace first, so a host that gives both is tried once (and
    ``detect_network`` knows without trying again); without one, as before."""
    global _detected
    if _detecting is not None and _detecting is not threading.current_thread():
        _detecting.join()
        if _detect_failed:
            raise _detect_failed[0]
    if _detected is None:
        _detected = NONE
        if sys.platform.startswith("linux"):
            root = os.geteuid() == 0 and system_tool("setpriv") is not None
            for level in ([PIDNS_UID] if root else []) + [PIDNS]:
                if network and _works(level, net=True):
                    _net_works[level] = True
                    _detected = level
                    break
                if _works(level):
                    if network:
                        _net_works[level] = False  # as detect_network would have found it
                    _detected = level
                    break
    return _detected


_net_works: Dict[str, bool] = {}


def answer_by_zygote(net: bool) -> bool:
    """Answer ``detect`` at ``pidns+uid`` (with ``net``: and ``detect_network`` there) with the probe's
    one ``sh`` started through this thread's zygote: the sandbox a one-slot root run's attempts get,
    whose namespaces are made anyway, instead of a fork of the runner making namespaces of its own
    for the probe (about 8 ms of CPU a run). True: answered, as ``detect`` finds it where it works.
    False: nothing is known, this thread's zygotes are given up (neither kind is started again on
    it: its processes start the per-process way), and ``detect`` probes the per-process way. Only
    before any probe ran."""
    global _detected
    if (_detected is not None or _detecting is not None or not sys.platform.startswith("linux")
            or os.geteuid() != 0 or system_tool("setpriv") is None):
        return False
    got = zygote.take(net)
    if got is None:
        return False
    status: Optional[int] = None
    try:
        devnull = os.open(os.devnull, os.O_RDWR)
        try:
            _pid, pidfd = got.start(["sh", "-c", probe_script(PIDNS_UID, net)], {"PATH": os.defpath}, "/",
                                    UID_BASE + UID_SPAN - 1, [devnull, devnull, devnull])
        finally:
            os.close(devnull)
        os.close(pidfd)  # the zygote reaps it and says its status
        status = got.status(_PROBE_TIMEOUT_S)
    except OSError:
        pass
    if status != 0:  # failed, or still running after the probe's time (the zygote's end kills it)
        zygote.give_up()
        return False
    _detected = PIDNS_UID
    if net:
        _net_works[PIDNS_UID] = True
    return True


def detect_network(level: str) -> bool:
    """Whether this host gives an attempt at ``level`` a network namespace of its own (tried once)."""
    if level == NONE:
        return False
    if level not in _net_works:
        _net_works[level] = _works(level, net=True)
    return _net_works[level]


def attempt_sandbox(level: str, uid: int, *paths: str, net: bool = False, writable: Sequence[str] = ()) -> Sandbox:
    """An attempt's sandbox at the run's ``level`` (``uid``: the attempt's, see ``attempt_uid``; ``net``:
    a network namespace of its own; ``writable``: the runner's workspace, see ``Sandbox.writable``); a
    root runner whose ``paths`` another uid cannot reach gives it ``pidns`` where that works."""
    if level == PIDNS_UID:
        if all(reachable_by_others(p) for p in paths):
            box = Sandbox(level, uid, net)
            box.reuse = True
            return box
        level = PIDNS if _works(PIDNS) else NONE
        net = net and detect_network(level)
    return Sandbox(level, net=net, writable=writable)
