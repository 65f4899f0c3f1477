"""The exit statuses of ``dibs``, and which one a dibs error ends the command with.

The help texts (:mod:`dibs._cli.parser`) list them, the commands return them, and
:func:`exit_status` maps an error to one, so a script can tell "try again later" from "fix the
command" from "the data is bad" without reading the message. ``dibs run`` adds COMMAND's own status
and 127 (see :mod:`dibs._cli.run`); a stop signal ends it with 128 + the signal's number.
"""

from __future__ import annotations

from dibs.errors import (
    ArtifactCorrupted,
    ConfigurationError,
    CorruptRecord,
    ReservationError,
    SerializationError,
    StoreUnavailable,
    WaitTimeout,
)

__all__ = [
    "EXIT_DATAERR",
    "EXIT_NOTHING",
    "EXIT_PIPE",
    "EXIT_TIMEOUT",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "exit_status",
]

EXIT_NOTHING = 1  # show / release / forget: nothing there to show, release or forget
EXIT_USAGE = 2  # a bad option, key, namespace or store URL, a missing driver
EXIT_DATAERR = 65  # EX_DATAERR: a stored artifact or record that cannot be read
EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE: the store cannot be reached
EXIT_TIMEOUT = 75  # EX_TEMPFAIL: the wait timed out; try again later
EXIT_PIPE = 141  # 128 + SIGPIPE: whoever read stdout went away


def exit_status(exc: ReservationError) -> int:
    """The status ``dibs`` ends with when ``exc`` stops a command."""
    if isinstance(exc, WaitTimeout):
        return EXIT_TIMEOUT
    if isinstance(exc, StoreUnavailable):
        return EXIT_UNAVAILABLE
    if isinstance(exc, ConfigurationError):
        return EXIT_USAGE
    if isinstance(exc, ArtifactCorrupted | CorruptRecord | SerializationError):
        return EXIT_DATAERR
    return 1
