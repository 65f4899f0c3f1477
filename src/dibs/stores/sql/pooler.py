"""What a PostgreSQL store's connections reach, the server itself or a pooler in front of it
(PgBouncer), and what each allows at connect and per statement (issue 29).

Two things that are free on a server break behind a pooler:

* **Startup options.** dibs sends ``lock_timeout`` in the ``options`` startup parameter, so that a
  lock wait ends with a clean error before the client's bound (``?timeout=``) shuts the connection,
  at no cost per call. Stock PgBouncer refuses the parameter (``FATAL: unsupported startup
  parameter: options``); told to ignore it (``ignore_startup_parameters = options``), it drops it.
* **Server-side prepared statements.** psycopg prepares a statement on the server after it ran five
  times (``prepare_threshold``). A transaction pooler hands each transaction to whichever server
  connection is free, so the name is missing there (``prepared statement "_pg3_2" does not exist``),
  taken by another client (``... already exists``), or names another client's statement: ``bind
  message supplies 8 parameters, but prepared statement "_pg3_2" requires 1`` (measured, issue 29),
  and, when the parameters happen to fit, *another statement runs with this one's values*. That can be
  prevented, not repaired, so the pooler must be known before the first statement is prepared.

What the URL reaches is said by ``?pooler=`` (:data:`MODES`), or found out by the first connection
when it is not given: a server refusing the startup options is a pooler, and so is one that accepted
them without their taking effect (``pg_settings.source`` of ``lock_timeout`` is not ``client``: a
pooler dropped them), one query on the first connection only. A pooler found this way is treated as
a transaction pooler, the one mode safe for both (``?pooler=session`` keeps prepared statements
behind a session pooler). Should sessions turn out mixed anyway (a URL whose target changed, a
``?pooler=`` that says otherwise), the store stops preparing and repeats the statement, which never
ran (:meth:`ServerEnd.sessions_mixed`), or refuses a URL that claimed otherwise with a
:class:`~dibs.errors.ConfigurationError`.

Behind a pooler, lock waits are bounded by the client alone; docs/deploy.md recommends the
server-side default instead (``ALTER ROLE ... SET lock_timeout``), which a pooler cannot drop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from dibs.errors import ConfigurationError

__all__ = ["MODES", "ServerEnd", "check_mode", "refused_options"]

log = logging.getLogger("dibs.stores.sql")

#: ``?pooler=``: ``none`` (the URL reaches the server itself: startup options and prepared statements),
#: ``session`` (a pooler that gives each client connection one server connection for its whole life,
#: PgBouncer's ``pool_mode = session``: no startup options, prepared statements kept), ``transaction``
#: (PgBouncer's ``pool_mode = transaction`` or ``statement``: neither, and no ``LISTEN`` through it).
MODES = ("none", "session", "transaction")


def check_mode(text: str | None) -> str | None:
    """The ``?pooler=`` option checked (``None``: not given, found out at the first connection)."""
    if text is None:
        return None
    mode = text.strip().lower()
    if mode == "statement":  # PgBouncer's third mode: one transaction is one statement
        mode = "transaction"
    if mode not in MODES:
        raise ConfigurationError(
            f"pooler={text!r} is not a pooling mode; use pooler=transaction (PgBouncer's pool_mode = "
            "transaction or statement), pooler=session (pool_mode = session) or pooler=none (the URL "
            "reaches PostgreSQL itself); without it, the first connection finds out"
        )
    return mode


def refused_options(error: BaseException) -> bool:
    """Whether a failed connection attempt was a pooler refusing the ``options`` startup parameter
    (PgBouncer: ``FATAL: unsupported startup parameter: options``)."""
    return "unsupported startup parameter: options" in str(error)


#: SQLSTATEs that say a statement psycopg prepared met another server session than its own (see the
#: module docstring): invalid_sql_statement_name, duplicate_prepared_statement, and protocol_violation
#: for a Bind that named another client's statement. Each comes before the statement ran.
_MIXED = frozenset({"26000", "42P05", "08P01"})


class ServerEnd:
    """What one URL reaches, decided once per store (see the module docstring), and how to connect to
    it: every connection of the store's pool and its listener go through :meth:`connect`."""

    def __init__(self, declared: str | None, shown_url: str, user_options: str | None = None) -> None:
        #: The URL's ``?pooler=``, ``None`` when not given.
        self.declared = declared
        self._url = shown_url
        self._user_options = user_options
        #: Whether a pooler is in front of the server; ``None`` until the first connection says.
        self.pooled: bool | None = None if declared is None else declared != "none"
        #: Why the store thinks so (for its log line and its errors).
        self.why = "" if declared is None else f"the URL says pooler={declared}"
        # No lock around these: each is one assignment, the GIL orders them, and two connections that
        # find the same thing at once only say it twice (a lock held at a fork would outlive it).
        self._prepares = declared != "transaction"

    @property
    def prepares(self) -> bool:
        """Whether psycopg may prepare statements on the server (a server itself, a session pooler)."""
        return self._prepares and self.pooled is not None and (not self.pooled or self.declared == "session")

    @property
    def sends_options(self) -> bool:
        """Whether connections send startup options (``lock_timeout``): not to a pooler."""
        return not self.pooled  # undecided: the first connection tries, and finds out

    def connect(self, open_: Callable[[dict[str, Any]], Any], params: Mapping[str, Any]) -> Any:
        """A new DBAPI connection, ``open_(params)`` with ``options`` left out for a pooler, or left
        out and tried again when the server end refuses them; prepared statements off unless allowed."""
        params = dict(params)
        if self.pooled is None and "options" not in params:
            # Nothing sent at startup (a caller's own connect_args): nothing to find out from. Taken as
            # the server itself, as before this check existed; ?pooler= says otherwise.
            self.pooled, self.why = False, "taken as the server itself (no startup options sent)"
        if not self.sends_options:
            params.pop("options", None)
            return self._configured(open_(params))
        try:
            connection = open_(params)
        except Exception as exc:
            if not refused_options(exc):
                raise
            self._refused(exc)
            params.pop("options", None)
            return self._configured(open_(params))
        if self.pooled is None:
            try:
                self._check_options_arrived(connection)
            except BaseException:
                connection.close()
                raise
        return self._configured(connection)

    def _configured(self, connection: Any) -> Any:
        if not self.prepares:
            connection.prepare_threshold = None  # no server-side prepared statements at all
        return connection

    def _refused(self, error: BaseException) -> None:
        """The server end refused the startup options: a pooler (or a URL that says otherwise)."""
        if self.declared == "none":
            raise ConfigurationError(
                f"{self._url} has pooler=none, but the server end refuses the startup parameter 'options' "
                "(FATAL: unsupported startup parameter: options): it is a pooler such as PgBouncer. Use "
                "pooler=transaction or pooler=session (its pool_mode), or leave pooler= out",
                store=self._url,
            ) from None
        if self._user_options:
            raise ConfigurationError(
                f"{self._url}: the server end is a pooler (such as PgBouncer) that refuses the startup "
                f"parameter 'options', and the URL sets options={self._user_options!r}, which cannot reach "
                "the server through it: make them defaults of the role or the database instead (ALTER ROLE "
                "... SET ...), or point the URL at the server itself",
                store=self._url,
            ) from None
        self._found("it refused the startup parameter 'options'")

    def _check_options_arrived(self, connection: Any) -> None:
        """The first connection of a URL without ``?pooler=``: did the startup options reach the server?"""
        cursor = connection.cursor()
        try:
            cursor.execute("SELECT source FROM pg_settings WHERE name = 'lock_timeout'")
            row = cursor.fetchone()
        finally:
            cursor.close()
        if not connection.autocommit:
            connection.rollback()
        if row is not None and row[0] == "client":
            self.pooled, self.why = False, "the startup options reached the server"
            return
        if self._user_options:
            raise ConfigurationError(
                f"{self._url}: the startup options do not reach the server (a pooler such as PgBouncer "
                f"with ignore_startup_parameters = options drops them), and the URL sets "
                f"options={self._user_options!r}: make them defaults of the role or the database instead "
                "(ALTER ROLE ... SET ...), or point the URL at the server itself",
                store=self._url,
            )
        self._found("the startup options it was sent did not reach the server (ignore_startup_parameters)")

    def _found(self, why: str) -> None:
        if self.pooled:
            return
        self.pooled, self.why = True, f"a pooler: {why}"
        log.info(
            "%s is %s; so no lock_timeout at connect (lock waits are bounded by ?timeout= on the client: "
            "set lock_timeout as a default of the role, see docs/deploy.md) and no server-side prepared "
            "statements (a transaction pooler mixes them up; add ?pooler=session to keep them behind a "
            "session pooler, or ?pooler=transaction to say so and skip this check)",
            self._url,
            self.why,
        )

    # -- prepared statements that met another session ---------------------------------------------
    def sessions_mixed(self, error: BaseException) -> bool:
        """Whether ``error`` says a prepared statement met another server session than its own (a
        transaction pooler), while this store prepares statements: then it must stop."""
        code = getattr(error, "sqlstate", None)
        return self._prepares and code in _MIXED and '"_pg3_' in str(error)

    def stop_preparing(self, error: BaseException) -> ConfigurationError | None:
        """A prepared statement met another session (:meth:`sessions_mixed`): prepare no more; the
        error for a URL that said it reaches a server or a session pooler, ``None`` otherwise (the
        caller drops its connections and repeats the statement, which never ran)."""
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        if self.declared in ("none", "session"):
            return ConfigurationError(
                f"{self._url} has pooler={self.declared}, but its connections do not keep their server "
                f"session ({type(error).__name__}: {first_line[:200]}): the server end pools transactions "
                "(PgBouncer's pool_mode = transaction). Use pooler=transaction",
                store=self._url,
            )
        if not self._prepares:
            return None
        self._prepares = False
        self.pooled, self.why = True, "a transaction pooler: its prepared statements met other sessions"
        log.warning(
            "%s: a prepared statement met another server session (%s: %s), so the server end pools "
            "transactions (PgBouncer's pool_mode = transaction) although its startup options arrived; no "
            "more prepared statements. Add ?pooler=transaction to the URL: until then, a statement may "
            "be run in another client's place before this shows",
            self._url,
            type(error).__name__,
            first_line[:200],
        )
        return None
