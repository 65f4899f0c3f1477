"""Text that came from a store or a user, made safe to show in a terminal or a log.

Owners, error summaries, and whatever a foreign record holds are data, not output: printed raw, an
escape sequence in one could recolour, rewrite or hide what an operator reads in ``dibs ls``, a NUL
or a lone surrogate could cut a line short or make the print itself fail. :func:`printable` keeps
every printable character (any script, any emoji) and writes everything else as a Python escape.
"""

from __future__ import annotations

__all__ = ["printable"]

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text: object) -> str:
    """``str(text)`` with every non-printable character (controls, escape sequences, bidirectional
    overrides, line separators, surrogates) replaced by its backslash escape, e.g. ``\\x1b``."""
    value = str(text)
    if value.isprintable():
        return value
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in value)


def _escape(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"
