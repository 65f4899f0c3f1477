"""What dibs shows people: text made safe for a terminal or a log, and durations read at a glance.

Owners, error summaries, and whatever a foreign record holds are data, not output: printed raw, an
escape sequence in one could recolour, rewrite or hide what an operator reads in ``dibs ls``, a NUL
or a lone surrogate could cut a line short or make the print itself fail. :func:`printable` keeps
every printable character (any script, any emoji) and writes everything else as a Python escape.

:func:`duration` writes seconds the way the command line, the Airflow plugin and the integrations'
log lines all show them, so an age or a wait reads the same wherever it is seen; :func:`last_failure`
says what a key's last holder left, the same way in each.
"""

from __future__ import annotations

from dibs.stops import is_stop

__all__ = ["duration", "last_failure", "printable"]

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


def last_failure(failures: int, owner: str | None, error: str) -> str:
    """What a key's last holder left, after the key's name: ``failed 2 time(s) before; last error from
    'etl-1': ValueError: ...``, or, when it was stopped (Ctrl-C, a cancellation, Airflow's ``on_kill``:
    recorded, never counted as a failure), ``was stopped before: its last holder, 'etl-1', was stopped:
    the task was killed (on_kill)``, with the failures counted before it when there were any."""
    if not is_stop(error):
        return f"failed {failures} time(s) before; last error from {owner!r}: {error}"
    earlier = f" (and failed {failures} time(s) before that)" if failures else ""
    return f"was stopped before: its last holder, {owner!r}, was {error}{earlier}"


def duration(seconds: float) -> str:
    """``0.4s``, ``12s``, ``3m 05s``, ``2h 10m``, ``3d 4h``: precise when short, rounded when long."""
    seconds = max(0.0, seconds)
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"
