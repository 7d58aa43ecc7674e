"""The key filter's program, run by a small interpreter of the three instructions it uses, for every
machine it is built for: the calls it refuses and lets through, by architecture, call and argument.
The filter's effect in a real attempt is attacked in test_zygote.py; this covers the architectures
this machine cannot run."""

from __future__ import annotations

import struct

import pytest

from agent_runner import privs

ALLOW, EPERM = 0x7FFF0000, 0x00050000 | 1
JOIN = privs._KEYCTL_JOIN_SESSION_KEYRING


def run(program: privs._SockFprog, arch: int, nr: int, args: tuple[int, ...] = ()) -> int:
    """What the kernel's seccomp would answer for this call (little-endian ``seccomp_data``)."""
    words = (list(args) + [0] * 6)[:6]
    data = struct.pack("<iIQ6Q", nr, arch, 0, *words)
    pc, acc = 0, 0
    for _ in range(program.len + 1):
        insn = program.filter[pc]
        if insn.code == privs._LD_ABS:
            acc = struct.unpack_from("<I", data, insn.k)[0]
            pc += 1
        elif insn.code == privs._JEQ:
            pc += 1 + (insn.jt if acc == insn.k else insn.jf)
        elif insn.code == privs._RET:
            return int(insn.k)
        else:
            raise AssertionError(f"instruction {insn.code:#x} not interpreted")
    raise AssertionError("the program did not return")


@pytest.mark.parametrize("machine", sorted(privs._KEY_CALLS))
def test_every_key_call_is_refused_but_joining_a_new_anonymous_session_keyring(machine: str) -> None:
    program = privs.key_program(machine)
    assert program is not None
    (arch, calls), (compat_arch, compat_calls) = privs._KEY_CALLS[machine]
    add_key, request_key, keyctl = calls
    assert run(program, arch, keyctl, (JOIN, 0)) == ALLOW
    assert run(program, arch, keyctl, (JOIN, 0x7FFF0000)) == EPERM  # a named keyring: another's to join
    assert run(program, arch, keyctl, (JOIN, 1 << 32)) == EPERM  # the pointer's high word counts too
    assert run(program, arch, keyctl, (0, 0)) == EPERM  # KEYCTL_GET_KEYRING_ID
    assert run(program, arch, add_key) == EPERM and run(program, arch, request_key) == EPERM
    assert run(program, arch, 0) == ALLOW and run(program, arch, 60) == ALLOW  # other calls go through
    for nr in compat_calls:  # the 32-bit calls of the same kernel: every key call refused
        assert run(program, compat_arch, nr) == EPERM
    assert run(program, compat_arch, 3) == ALLOW
    # an architecture the filter does not know: nothing it asks is taken for harmless
    assert run(program, 0xC0000028, 0) == EPERM and run(program, 0x12345678, keyctl, (JOIN, 0)) == EPERM


def test_x86_64s_x32_calls_are_refused() -> None:
    program = privs.key_program("x86_64")
    assert program is not None
    for nr in privs._KEY_CALLS["x86_64"][0][1]:
        assert run(program, 0xC000003E, privs._X32 | nr, (JOIN, 0)) == EPERM


def test_the_filter_is_built_once_per_process() -> None:
    assert privs.key_filter() is privs.key_filter()
