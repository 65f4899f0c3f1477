"""What a database's error means to dibs, said once: a :class:`~dibs.errors.StoreUnavailable` worded
for people (never a secret of the URL), and what the retrying code needs to know of it: whether the
server rolled the statement back (so it may run again), refuses writes (a standby), or had closed
the connection."""

from __future__ import annotations

from collections.abc import Callable

from dibs.errors import StoreUnavailable
from dibs.stores import hide_secrets
from dibs.stores.sql.schema import refuses_writes

__all__ = ["ROLLED_BACK_ATTEMPTS", "Translator"]

#: MySQL/MariaDB errors that mean the statement was rolled back by the server, so it may run again:
#: 1213 deadlock, 1205 lock wait timeout. How often, before the error is reported.
ROLLED_BACK = (1213, 1205)
ROLLED_BACK_ATTEMPTS = 5


class Translator:
    """One store's translation of its driver's errors (its URL, shown redacted, its secrets, kept out)."""

    def __init__(
        self,
        url: str,
        secrets: tuple[str, ...],
        dialect: str,
        timeout: float,
        pool_size: Callable[[], object],
    ) -> None:
        self.url, self.secrets, self.dialect, self.timeout = url, secrets, dialect, timeout
        self._pool_size = pool_size

    def first_line(self, error: BaseException, limit: int) -> str:
        """The first line of a driver's message, without any secret of the URL."""
        text = str(error).strip()
        first = text.splitlines()[0] if text else type(error).__name__
        return hide_secrets(first, self.secrets)[:limit]

    def unavailable(
        self, exc: Exception, *, disconnected: bool = False, timed_out: bool = False
    ) -> StoreUnavailable:
        """``exc`` as :class:`StoreUnavailable`. ``disconnected``: the server had closed the connection
        (a statement that is safe to repeat runs again on a fresh one: ``SQLStore._repeatable``);
        ``timed_out``: the call's bound shut it (see :mod:`dibs.stores.sql.bounds`)."""
        orig = getattr(exc, "orig", None) or exc
        why = f"{type(orig).__name__}: {self.first_line(orig, 300)}"
        if timed_out:
            why = (
                f"no answer within the store's timeout ({self.timeout:g}s, ?timeout= in the URL), so the "
                f"connection was closed ({why})"
            )
        elif refuses_writes(self.dialect, orig):
            why += (
                "; the server takes no writes (a standby, or the server or session set read-only), and "
                "taking or ending a lease writes: point the store URL at the primary"
            )
        elif too_many_clients(why):
            why += (
                f"; every process holds up to {self._pool_size()} pooled "
                "connections of this store "
                "(one while it only waits) plus, on PostgreSQL, one listener: lower ?pool_size= in the "
                "store URL, raise the server's max_connections, or put PgBouncer in front of the server "
                "(transaction mode, with ?listen_url= to the server for the listener: docs/deploy.md)"
            )
        error = StoreUnavailable(f"SQL store {self.url} failed: {why}", store=self.url)
        error.disconnected = disconnected  # type: ignore[attr-defined]  # not a field: never pickled
        error.rolled_back = (  # type: ignore[attr-defined]
            self.dialect in ("mysql", "mariadb") and error_code(orig) in ROLLED_BACK
        )
        error.read_only = refuses_writes(self.dialect, orig)  # type: ignore[attr-defined]
        return error


def error_code(error: BaseException) -> int | None:
    """A MySQL driver error's number (``args[0]``), if it has one."""
    code = error.args[0] if error.args else None
    return code if isinstance(code, int) else None


def too_many_clients(message: str) -> bool:
    """The server refused a connection because it has as many as it takes."""
    text = message.lower()
    return (
        "too many clients" in text
        or "too many connections" in text
        or "remaining connection slots are reserved" in text
    )
