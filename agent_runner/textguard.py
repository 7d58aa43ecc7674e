"""Text from a suite or a host is data: control characters are named or shown, never obeyed.

``printable`` is what every renderer (terminal, report.md, junit.xml) passes untrusted text through:
ANSI colour and cursor sequences are dropped (a predicate's coloured output stays readable) and every
other control character except newline and tab is shown as ``\\xNN``, so a host cannot clear a
screen, forge a line or make an XML file unparseable. ``control_char`` is the validators' test: a
name, an id or a path that holds one is refused, because no newline or control character is ever
valid in them.
"""

import re
from typing import Optional

# CSI (ESC [ ... final) and OSC (ESC ] ... BEL or ESC \) sequences: terminal colour, cursor, title
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")
# C0 except tab and newline, DEL, C1
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_ANY_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def printable(text: object) -> str:
    """``text`` with ANSI sequences removed and other control characters (not ``\\n``, ``\\t``) shown as ``\\xNN``."""
    s = _ANSI.sub("", str(text))
    return _CONTROL.sub(lambda m: "\\x%02x" % ord(m.group()), s)


def one_line(text: object) -> str:
    """``text`` as one line of data: ``printable``, and newlines and tabs shown as ``\\xNN`` too (a
    name a host sent can then never add a line to what it is shown in)."""
    s = _ANSI.sub("", str(text))
    return _ANY_CONTROL.sub(lambda m: "\\x%02x" % ord(m.group()) if ord(m.group()) < 256 else "\\u%04x" % ord(m.group()), s)


def control_char(text: str) -> Optional[str]:
    """The first control character in ``text`` (newline and tab included) as ``\\xNN``, or None."""
    m = _ANY_CONTROL.search(text)
    return (
        None
        if m is None
        else "\\x%02x" % ord(m.group())
        if ord(m.group()) < 256
        else "\\u%04x" % ord(m.group())
    )
