"""How the command writes things for people and for scripts: sizes, artifacts, tables; durations read.

No raw epochs: durations are spelled out (``3m 05s``, by :func:`dibs.display.duration`, which the
integrations share) and read back the same way, instants are ISO 8601 in UTC. Table cells are never
cut inside a word; on a terminal the last column wraps at word boundaries instead.
"""

from __future__ import annotations

import base64
import datetime as dt
import math
import re
import sys
import textwrap
from typing import IO, Any, Literal

from dibs.display import printable

__all__ = ["artifact_text", "instant", "parse_duration", "print_table", "size"]

Encoding = Literal["utf-8", "base64", "json"]


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


def parse_duration(text: str) -> float:
    """Seconds from what people type: ``90`` or ``90s``, ``15m``, ``12h``, ``7d``, ``2w``, and sums
    such as ``1h30m`` (the way :func:`dibs.display.duration` writes them, spaces allowed).
    ``ValueError`` names the text and the accepted forms."""
    compact = text.strip().lower().replace(" ", "")
    try:
        seconds = float(compact)
    except ValueError:
        parts = _PART.findall(compact)
        if not parts or "".join(n + u for n, u in parts) != compact:
            raise ValueError(
                f"expected a duration such as 90 (seconds), 90s, 15m, 12h, 7d, 2w or 1h30m; got {text!r}"
            ) from None
        seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"expected a duration of 0 seconds or more, got {text!r}")
    return seconds


def size(nbytes: int) -> str:
    """``512 B``, ``1.2 kB``, ``3.4 MB`` (decimal units, as file managers show them)."""
    if nbytes < 1000:
        return f"{nbytes} B"
    value = float(nbytes)
    for unit in ("kB", "MB", "GB", "TB"):
        value /= 1000
        if value < 1000 or unit == "TB":
            break
    return f"{value:.1f} {unit}"


def instant(seconds: float | None) -> str | None:
    """A store timestamp as ISO 8601 UTC with milliseconds (``None`` stays ``None``)."""
    if seconds is None:
        return None
    try:
        return dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat(timespec="milliseconds")
    except (OverflowError, ValueError, OSError):  # beyond the year 9999, or not a number at all
        return f"{seconds!r} (not a date)"


def artifact_text(value: Any) -> tuple[Any, Encoding]:
    """An artifact's value for a JSON document, and how it was written there.

    ``dibs run`` stores bytes: UTF-8 text is given as text (``"utf-8"``), anything else as base64
    (``"base64"``). A value stored by a Python or orchestrator caller with the JSON serializer is
    given as it is (``"json"``).
    """
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            return base64.b64encode(value).decode("ascii"), "base64"
    return value, "json"


def print_table(
    rows: list[dict[str, Any]],
    columns: list[str],
    out: IO[str] | None = None,
    *,
    width: int | None = None,
    header: bool = True,
) -> None:
    """A plain aligned table (no dependency): what people read in terminals and CI logs.

    With ``width`` (a terminal's), the last column is wrapped at word boundaries to fit, its
    continuation lines aligned under it; without, every row is one line, whatever its length.
    Nothing is ever cut: a word longer than the room left stays whole on its own line. Without
    ``header``, the rows continue a table printed before (a listing's next page): no header, and
    nothing said when there are none.
    """
    out = out or sys.stdout
    cells = [[("" if row.get(c) is None else printable(row[c])) for c in columns] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    indent = sum(widths[:-1]) + 2 * (len(columns) - 1)
    room = None if width is None else max(24, width - indent - 1)
    if header:
        print("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip(), file=out)
    for r in cells:
        head = "  ".join(v.ljust(w) for v, w in zip(r[:-1], widths[:-1], strict=True))
        last = r[-1]
        lines = _wrap(last, room) if room is not None and len(last) > room else [last]
        print(f"{head}  {lines[0]}".rstrip() if len(columns) > 1 else lines[0], file=out)
        for more in lines[1:]:
            print(" " * (indent if len(columns) > 1 else 0) + more, file=out)
    if not rows and header:
        print("(none)", file=out)


def _wrap(text: str, room: int) -> list[str]:
    return textwrap.wrap(text, room, break_long_words=False, break_on_hyphens=False) or [""]
