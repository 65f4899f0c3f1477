"""Where dibs keeps its state by default, and who a process is when it does not say.

Store resolution, in order: an explicit store or URL, the ``DIBS_STORE_URL`` environment variable,
then an embedded SQLite database at :func:`default_store_path`:

* ``$DIBS_HOME/dibs.db`` when ``DIBS_HOME`` is set,
* else ``$XDG_STATE_HOME/dibs/dibs.db`` (``~/.local/state/dibs/dibs.db`` when unset) on Linux/BSD,
* ``~/Library/Application Support/dibs/dibs.db`` on macOS, ``%LOCALAPPDATA%\\dibs\\dibs.db`` on Windows.

The embedded default coordinates processes of one user on one machine; set ``DIBS_STORE_URL`` to a
shared store (PostgreSQL, Redis, Azure Blob) to coordinate machines. It keeps artifacts over 64 KiB
in the folder ``payloads`` beside its file (:func:`embedded_payloads_url`), unless a payload store is
named (``payloads=`` or ``DIBS_PAYLOADS_URL``), so that a large value never needs a setting.
"""

from __future__ import annotations

import os
import secrets
import socket
import sys
from pathlib import Path

from dibs.errors import ConfigurationError

__all__ = [
    "MAX_SECONDS",
    "STORE_URL_ENV",
    "default_owner",
    "default_store_path",
    "default_store_url",
    "embedded_payloads_url",
    "embedded_store_url",
    "validate_seconds",
]

STORE_URL_ENV = "DIBS_STORE_URL"
HOME_ENV = "DIBS_HOME"


def default_store_path() -> Path:
    if home := os.environ.get(HOME_ENV):
        return Path(home).expanduser() / "dibs.db"
    if sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    elif sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local"))
    else:
        base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return base / "dibs" / "dibs.db"


def default_store_url() -> str:
    """``DIBS_STORE_URL`` if set, else the embedded SQLite database (its folder is created)."""
    if url := os.environ.get(STORE_URL_ENV, "").strip():
        return url
    path = default_store_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    return embedded_store_url()


def embedded_store_url() -> str:
    """The URL of the embedded SQLite database (:func:`default_store_path`), whatever ``DIBS_STORE_URL``
    says."""
    return f"sqlite:///{default_store_path()}"


def embedded_payloads_url() -> str:
    """Where the embedded database keeps large artifacts: the folder ``payloads`` beside its file
    (see :func:`dibs.payloads.default_payloads_url`)."""
    return (default_store_path().parent / "payloads").as_uri()


def default_owner() -> str:
    """A fresh identity for one caller: host, process and 48 random bits (``host:pid:random``)."""
    return f"{_host_and_process()}{secrets.token_hex(6)}"


#: ``host:pid:`` of this process, read once (two system calls of every ask that names no owner);
#: a forked child reads its own.
_HOST_AND_PROCESS: list[str] = []


def _host_and_process() -> str:
    if not _HOST_AND_PROCESS:
        _HOST_AND_PROCESS.append(f"{socket.gethostname()}:{os.getpid()}:")
    return _HOST_AND_PROCESS[0]


if hasattr(os, "register_at_fork"):  # POSIX: where a process can be forked
    os.register_at_fork(after_in_child=_HOST_AND_PROCESS.clear)


#: The longest duration dibs accepts for any setting (ttl, intervals, timeouts, maximum lease age):
#: ten years, 315,360,000 seconds. Anything longer is a mistake (a timeout that should be ``None``, a
#: value in milliseconds), and letting it through breaks things far from the typo: a wait beyond
#: ``threading.TIMEOUT_MAX`` raises ``OverflowError`` in whichever thread sleeps on it (one such ttl
#: once stopped the heartbeats of every client in the process), and an expiry beyond the year 9999
#: cannot be shown as a date.
MAX_SECONDS = 10 * 365 * 86400.0


def validate_seconds(
    name: str,
    value: object,
    *,
    allow_none: bool = False,
    allow_zero: bool = False,
    maximum: float = MAX_SECONDS,
) -> float | None:
    """``value`` as float seconds, or a :class:`ConfigurationError` naming the setting and the rule.

    Every duration a user can give goes through here, so that they share one rule: a real number
    (not a bool, not NaN), greater than 0 (or at least 0 with ``allow_zero``), and at most
    ``maximum``, which is :data:`MAX_SECONDS` unless the setting has a tighter bound of its own.
    """
    if value is None and allow_none:
        return None
    none = " or None" if allow_none else ""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:  # noqa: PLR0124 (NaN)
        raise ConfigurationError(f"{name} must be a number of seconds{none}, got {value!r}", setting=name)
    limit = min(maximum, MAX_SECONDS)
    if value < 0 or (value == 0 and not allow_zero) or value > limit:
        lowest = "0 or more" if allow_zero else "greater than 0"
        raise ConfigurationError(
            f"{name} must be a number of seconds {lowest} and at most {limit:,.0f}{none}, got {value!r}",
            setting=name,
        )
    return float(value)
