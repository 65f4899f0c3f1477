"""The ``dibs`` connection type, turned into a :class:`dibs.Reservations` client.

The hook is a thin adapter: it reads a connection, checks every field once with a message that names
the field and what would be right, and hands the result to the core client. Stores, credentials of
the stores themselves, waiting and heartbeats all live in :mod:`dibs`; nothing here talks to a store
directly, and nothing here touches Airflow's metadata database (connections come through the Task
SDK, i.e. secrets backends and the execution API).

A ``dibs`` connection keeps everything in its extra, so it can be written as JSON::

    AIRFLOW_CONN_DIBS_DEFAULT='{"conn_type": "dibs", "password": "s3cret",
        "extra": {"store_url": "postgresql+psycopg://dibs@db/dibs", "namespace": "team.features"}}'

=====================  ======================================================================
field                  meaning
=====================  ======================================================================
``store_url`` (extra)  the store (see :mod:`dibs.stores`); empty: ``DIBS_STORE_URL``, then the
                       embedded SQLite default
password               the store's password, inserted into ``store_url``'s ``user@host`` part,
                       so the secret stays in Airflow's masked password field
``namespace`` (extra)  key namespace (default ``default``)
``ttl`` (extra)        lease ttl in seconds (the core's default when empty)
``heartbeat_interval`` seconds between heartbeats (default a third of the ttl)
``wait_timeout``       seconds a task waits for another run's lease (empty: as long as it lives)
``max_lease_age``      no lease lives longer than this, however often it heartbeats (empty: none)
``max_age``            a stored result this many seconds old is computed again (empty: never)
``max_failures``       after this many recorded failures a key is refused until ``dibs forget``
``on_store_unavailable`` ``fail`` (default) or ``run``: run the work unreserved when the store is
                       unreachable at a task's first ask (logged), so the store never changes a result
``outage_patience``    seconds a waiting task (deferred, or asking again) keeps waiting while the
                       store is unreachable: 60 when empty, a managed database's failover
``payloads_url``       a payload store for results over 64 KiB (``file:///shared/dibs``,
                       ``azure://...``; see docs/payloads.md); empty: ``DIBS_PAYLOADS_URL``, else
                       results stay in the store's records
=====================  ======================================================================

All of them but ``store_url`` and ``wait_timeout`` become one :class:`dibs.Settings`, checked by the
core's own rules (a heartbeat interval shorter than the ttl, say), with the connection and field named
in every error.

Clients are cheap: every client of a process for one store shares the store object, its connection
pool and its watch hub (:mod:`dibs.runtime`), so a hook may build one per task or per trigger. In a
triggerer, the triggers that start together (a thousand tasks deferring at once) share one lookup of
their connection (one fetch in flight per connection and event loop), and the triggers waiting on one
connection share one async client, so starting them costs the loop little (issue 20); a trigger that
starts after that lookup has ended looks the connection up again.

A reserved task hands its trigger the connection it read (:meth:`DibsHook.for_trigger`), so the
triggerer does not look it up again: a triggerer's first lookup of a connection kept in the metadata
database starts Airflow's in-process execution API, which blocks the triggerer for seconds (a minute
on a loaded host; docs/airflow.md). It does so only where Airflow keeps trigger arguments to itself:
they are encrypted at rest, and Airflow 3.3 stopped showing them through its REST API, where any
Viewer read them before; on older releases a connection with a secret is still looked up.

Without a ``dibs_default`` connection the hook falls back to ``DIBS_STORE_URL`` and then to the
embedded default, and logs which one it used. A connection id that was asked for explicitly and
does not exist is an error instead: silently using another store would make reservations miss.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import functools
import json
import os
import re
import threading
from collections.abc import Callable, Coroutine, Hashable
from typing import Any, ClassVar
from urllib.parse import quote, urlsplit, urlunsplit

from airflow.sdk import BaseHook, Connection
from airflow.sdk.log import mask_secret
from asgiref.sync import sync_to_async

from dibs import AsyncReservations, ConfigurationError, Reservations, Settings
from dibs.integration import (
    STORE_URL_ENV,
    Configured,
    default_store_url,
    resolve_in_batches,
    runtime,
    take_turn,
    validate_seconds,
)
from dibs.keys import validate_namespace
from dibs.payloads import PAYLOADS_URL_ENV, is_open
from dibs.stores import STORE_SCHEMES, hide_secrets, redact_url, url_secrets
from dibs_provider import stats
from dibs_provider._compat import TRIGGER_KWARGS_PRIVATE, AirflowNotFoundException

__all__ = ["DEFAULT_CONN_ID", "DibsHook", "DibsSettings", "settings_from_connection"]

DEFAULT_CONN_ID = "dibs_default"
CONN_TYPE = "dibs"

#: Extra fields a ``dibs`` connection understands (also accepted with the ``extra__dibs__`` prefix
#: that older connection forms wrote).
EXTRA_FIELDS = (
    "store_url",
    "namespace",
    "ttl",
    "heartbeat_interval",
    "wait_timeout",
    "max_lease_age",
    "max_age",
    "max_failures",
    "on_store_unavailable",
    "outage_patience",
    "payloads_url",
)

# Stores addressed by a local path or a process name: there is no server to send a password to.
_PATH_SCHEMES = frozenset({"sqlite", "file", "memory"})

# What Rich reads as a markup tag (``rich.markup.RE_TAGS``): a bracket opened by a lowercase letter, '#',
# '/' or '@'. Airflow's CLI prints a connection test's message as markup (``airflow connections test``),
# so ``pip install 'dibs[postgres]'`` would read ``pip install 'dibs'`` there.
_MARKUP_TAG = re.compile(r"\[([a-z#/@][^\[\]]*)\]")


def markup_proof(message: str) -> str:
    """``message`` with every ``[word]`` written ``[ word ]``: no tag to Rich, the same text to a person
    reading the UI (which shows it plain), and still a valid requirement for pip (PEP 508 allows the
    spaces), so ``pip install 'dibs[ postgres ]'`` works copied from either."""
    return _MARKUP_TAG.sub(r"[ \1 ]", message)


@dataclasses.dataclass(frozen=True)
class DibsSettings(Configured):
    """A checked ``dibs`` connection: what the client is built from.

    ``store_url`` may contain the password (it is what the store connects with), so ``repr`` shows
    only :attr:`display_url`; ``source`` says where the settings came from, for logs. Its settings
    read as its own attributes, as a client's do (``settings.namespace``:
    :class:`dibs.integration.Configured`).
    """

    store_url: str = dataclasses.field(repr=False)
    source: str
    settings: Settings = dataclasses.field(default_factory=Settings)
    wait_timeout: float | None = None
    #: The payload store for large results (may carry a credential: shown redacted only).
    payloads_url: str | None = dataclasses.field(default=None, repr=False)

    @property
    def display_url(self) -> str:
        """The store URL with secrets replaced by ``***``: the only form that goes into logs."""
        return redact_url(self.store_url)

    def __repr__(self) -> str:
        return (
            f"DibsSettings(store={self.display_url!r}, source={self.source!r}, settings={self.settings!r}, "
            f"wait_timeout={self.wait_timeout})"
        )

    def client(self, *, namespace: str | None = None, ttl: float | None = None) -> Reservations:
        """A core client for these settings; ``namespace`` and ``ttl`` override the connection's."""
        try:
            settings = self.settings.replace(namespace=namespace, ttl=ttl)
        except ConfigurationError as exc:
            # The core names the setting (e.g. heartbeat_interval >= ttl); add where it came from.
            raise ConfigurationError(f"{self.source}: {exc.message}", **exc.fields) from exc
        return Reservations(self.store_url, settings=settings, payloads=self.payloads_url)


def _bad(conn_id: str, field: str, problem: str) -> ConfigurationError:
    return ConfigurationError(f"dibs connection {conn_id!r}: {field} {problem}", conn_id=conn_id, field=field)


def _seconds(conn_id: str, extra: dict[str, Any], name: str) -> float | None:
    value = extra.get(name)
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, str):  # URI-style connections carry every extra as text
        try:
            value = float(value)
        except ValueError:
            raise _bad(
                conn_id, f"extra {name!r}", f"must be a number of seconds (e.g. 60), got {value!r}"
            ) from None
    try:
        return validate_seconds(name, value)
    except ConfigurationError as exc:
        raise _bad(conn_id, f"extra {name!r}", exc.message.removeprefix(f"{name} ")) from exc


def _extras(conn_id: str, raw: dict[str, Any]) -> dict[str, Any]:
    """The known extra fields, prefix-normalised; unknown ones are an error (they are typos)."""
    extra: dict[str, Any] = {}
    unknown = []
    for field, value in raw.items():
        name = field.removeprefix(f"extra__{CONN_TYPE}__")
        if name in EXTRA_FIELDS:
            extra[name] = value
        else:
            unknown.append(field)
    if unknown:
        raise _bad(
            conn_id,
            "extra",
            f"has unknown field(s) {', '.join(map(repr, sorted(unknown)))}; a dibs connection understands "
            f"{', '.join(EXTRA_FIELDS)} (the store's password goes in the Password field)",
        )
    return extra


def _store_url(conn_id: str, value: object) -> str | None:
    url = _url(
        conn_id,
        value,
        "store_url",
        "a store URL such as 'postgresql+psycopg://dibs@db/dibs' or 'sqlite:////shared/dibs.db'",
    )
    scheme = url.split("://", 1)[0].split("+", 1)[0].lower() if url is not None else None
    if url is not None and scheme not in STORE_SCHEMES:
        raise _bad(
            conn_id,
            "extra 'store_url'",
            f"has unknown scheme {scheme!r} ({redact_url(url)!r}); known schemes: "
            + ", ".join(sorted(STORE_SCHEMES)),
        )
    return url


def _with_password(conn_id: str, url: str, password: str) -> str:
    """``url`` with ``password`` in its ``user@host`` part, percent-encoded like any URL password."""
    parts = urlsplit(url)
    scheme = parts.scheme.split("+", 1)[0].lower()
    if scheme in _PATH_SCHEMES or scheme == "azure":
        raise _bad(
            conn_id,
            "password",
            f"is set, but a {scheme!r} store has no server password to send it to; leave the Password "
            "field empty (the Password field is for postgresql, mysql and redis stores)",
        )
    if not parts.hostname:
        raise _bad(
            conn_id, "password", f"is set, but store_url {redact_url(url)!r} names no host to log in to"
        )
    if parts.password is not None:
        raise _bad(
            conn_id,
            "password",
            "is set and store_url contains a password too; keep the password only in the Password field "
            "(where Airflow masks it) and write store_url as scheme://user@host/...",
        )
    userinfo, _, hostport = parts.netloc.rpartition("@")
    encoded = quote(password, safe="")
    if encoded != password:
        mask_secret(encoded)  # Airflow masks the raw password; the URL carries this form of it
    netloc = f"{userinfo}:{encoded}@{hostport}"
    return urlunsplit(parts._replace(netloc=netloc))


def settings_from_connection(conn: Connection) -> DibsSettings:
    """Check a ``dibs`` connection and turn it into :class:`DibsSettings`, or a clear error.

    Every problem is a :class:`dibs.ConfigurationError` naming the connection, the field and what would be
    right; the password never appears in it.
    """
    conn_id = conn.conn_id
    if conn.conn_type not in (None, "", CONN_TYPE):
        raise _bad(
            conn_id,
            "conn_type",
            f"is {conn.conn_type!r}; use conn_type 'dibs' with the store URL in extra 'store_url' "
            "(e.g. {'conn_type': 'dibs', 'extra': {'store_url': 'postgresql+psycopg://dibs@db/dibs'}})",
        )
    for field in ("host", "login", "schema", "port"):
        value = getattr(conn, field, None)
        if value not in (None, ""):
            raise _bad(
                conn_id,
                field,
                f"is set ({value!r}) but a dibs connection does not use it; put the whole store URL, "
                "user and host included, in extra 'store_url' and the password in the Password field",
            )
    extra = _extras(conn_id, conn.extra_dejson)
    url = _store_url(conn_id, extra.get("store_url"))
    source = f"connection {conn_id!r}"
    if url is None:
        url, fallback = _fallback_url()
        source = f"{source} (store_url empty: {fallback})"
    if conn.password:
        url = _with_password(conn_id, url, conn.password)
    namespace = extra.get("namespace") or "default"
    try:
        validate_namespace(namespace)
    except ConfigurationError as exc:
        raise _bad(conn_id, "extra 'namespace'", exc.message.removeprefix("invalid namespace ")) from exc
    chosen: dict[str, Any] = {
        "namespace": namespace,
        "ttl": _seconds(conn_id, extra, "ttl"),
        "heartbeat_interval": _seconds(conn_id, extra, "heartbeat_interval"),
        "max_lease_age": _seconds(conn_id, extra, "max_lease_age"),
        "max_age": _seconds(conn_id, extra, "max_age"),
        "max_failures": _count(conn_id, extra, "max_failures"),
        "on_store_unavailable": _choice(conn_id, extra, "on_store_unavailable", ("fail", "run")),
        "outage_patience": _seconds(conn_id, extra, "outage_patience"),
    }
    try:
        settings = Settings().replace(**chosen)
    except ConfigurationError as exc:  # the core's rules (heartbeat < ttl, ...), said per field
        field = exc.fields.get("setting", "extra")
        raise _bad(conn_id, f"extra {field!r}", exc.message.removeprefix(f"{field} ")) from exc
    return DibsSettings(
        store_url=url,
        source=source,
        settings=settings,
        wait_timeout=_seconds(conn_id, extra, "wait_timeout"),
        payloads_url=_payloads_url(conn_id, extra.get("payloads_url")),
    )


def _payloads_url(conn_id: str, value: object) -> str | None:
    return _url(
        conn_id,
        value,
        "payloads_url",
        "a payload store URL such as file:///shared/dibs or azure://container/prefix?account_url=...",
    )


def _url(conn_id: str, value: object, field: str, such_as: str) -> str | None:
    """The URL in extra ``field``, stripped; ``None`` if blank."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, str) or "://" not in value:
        raise _bad(conn_id, f"extra {field!r}", f"must be {such_as}, got {redact_url(str(value))!r}")
    return value.strip()


def _count(conn_id: str, extra: dict[str, Any], name: str) -> int | None:
    value = extra.get(name)
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        number = int(value) if isinstance(value, str) else value
    except ValueError:
        number = None
    if isinstance(number, bool) or not isinstance(number, int) or number < 1:
        raise _bad(conn_id, f"extra {name!r}", f"must be a positive whole number (e.g. 3), got {value!r}")
    return number


def _choice(conn_id: str, extra: dict[str, Any], name: str, choices: tuple[str, ...]) -> Any:
    value = extra.get(name)
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if value not in choices:
        raise _bad(
            conn_id, f"extra {name!r}", f"must be one of {', '.join(map(repr, choices))}, got {value!r}"
        )
    return value


def _fallback_url() -> tuple[str, str]:
    if os.environ.get(STORE_URL_ENV, "").strip():
        return default_store_url(), f"${STORE_URL_ENV}"
    return default_store_url(), "the embedded default store"


#: The fields of a ``dibs`` connection that its settings are read from (the others must be empty).
_CONNECTION_FIELDS = ("conn_type", "host", "login", "schema", "port", "password", "extra")


def _fields(conn: Connection) -> dict[str, Any]:
    """A connection's fields, as ``Connection(conn_id=..., **fields)`` takes them again (plain JSON)."""
    return {name: value for name in _CONNECTION_FIELDS if (value := getattr(conn, name, None)) is not None}


def _secret_values(fields: dict[str, Any]) -> list[str]:
    """The secrets in a connection's fields: its password, and those written in the URLs of its extra
    (an extra that is not JSON is taken as one secret: it cannot be read here)."""
    found = [str(fields["password"])] if fields.get("password") else []
    extra = fields.get("extra")
    if not extra:
        return found
    try:
        values = json.loads(extra) if isinstance(extra, str) else extra
    except ValueError:
        return [*found, str(extra)]
    for text in values.values() if isinstance(values, dict) else ():
        if isinstance(text, str) and "://" in text:
            found.extend(url_secrets(text))
    return found


def _given(conn_id: str, fields: dict[str, Any]) -> Connection | None:
    """The connection a task handed its trigger (``{}``: none), its secrets masked in this process's
    logs as a lookup would have masked them."""
    if not fields:
        return None
    for secret in _secret_values(fields):
        mask_secret(secret)
    return Connection(conn_id=conn_id, **fields)


def fallback_settings(conn_id: str) -> DibsSettings:
    """Settings when no ``dibs_default`` connection exists: ``DIBS_STORE_URL``, then the embedded store."""
    url, source = _fallback_url()
    return DibsSettings(store_url=url, source=f"{source} (no connection {conn_id!r})")


class DibsHook(BaseHook):
    """Build :class:`dibs.Reservations` clients from a ``dibs`` connection.

    :param dibs_conn_id: the connection (default ``dibs_default``; if that one does not exist,
        ``DIBS_STORE_URL`` and then the embedded default store are used).
    :param namespace: overrides the connection's namespace.
    :param ttl: overrides the connection's lease ttl.

    Sync callers (tasks) use :meth:`get_client`; the triggerer uses :meth:`aget_client`, which fetches
    the connection and opens the store off the event loop.
    """

    conn_name_attr = "dibs_conn_id"
    default_conn_name = DEFAULT_CONN_ID
    conn_type = CONN_TYPE
    hook_name = "dibs (task reservations)"

    #: Connection form for Airflow < 3.2, which does not read ``conn-fields`` from provider info.
    _UI_FIELD_BEHAVIOUR: ClassVar[dict[str, Any]] = {
        "hidden_fields": ["host", "port", "login", "schema"],
        "relabeling": {"password": "Store password or secret"},
        "placeholders": {
            "extra": '{"store_url": "postgresql+psycopg://dibs@db/dibs", "namespace": "default", "ttl": 60}',
            "password": "optional; inserted into the store URL",
        },
    }

    def __init__(
        self,
        dibs_conn_id: str = DEFAULT_CONN_ID,
        *,
        namespace: str | None = None,
        ttl: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.dibs_conn_id = dibs_conn_id
        self.namespace = namespace
        self.ttl = ttl
        self._settings: DibsSettings | None = None
        #: The connection this hook read, as its fields (``{}``: there is none by that id); ``None``
        #: until it has read one.
        self._read: dict[str, Any] | None = None
        #: How the settings were found, appended to their source in :attr:`store_described`.
        self._how = ""

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return dict(cls._UI_FIELD_BEHAVIOUR)

    # -- settings ---------------------------------------------------------------------------------
    @property
    def store_described(self) -> str:
        """The store the settings name and where they came from, for a log line (settings read)."""
        settings = self.get_settings()
        return f"{settings.display_url} (from {settings.source}{self._how})"

    def _settings_from(self, conn: Connection | None, how: str = "") -> DibsSettings:
        settings = (
            settings_from_connection(conn) if conn is not None else fallback_settings(self.dibs_conn_id)
        )
        self.log.info("dibs store %s (from %s%s)", settings.display_url, settings.source, how)
        self._settings = settings
        self._read = {} if conn is None else _fields(conn)
        return settings

    def _missing(self, exc: AirflowNotFoundException) -> None:
        if self.dibs_conn_id != DEFAULT_CONN_ID:
            raise ConfigurationError(
                f"dibs connection {self.dibs_conn_id!r} is not defined; create it (conn_type 'dibs', "
                f"store URL in extra 'store_url') or leave the connection id at {DEFAULT_CONN_ID!r} to "
                f"use ${STORE_URL_ENV} or the embedded default store",
                conn_id=self.dibs_conn_id,
                field="conn_id",
            ) from exc

    def get_settings(self) -> DibsSettings:
        """The checked connection (read once per hook)."""
        if self._settings is not None:
            return self._settings
        try:
            conn: Connection | None = self.get_connection(self.dibs_conn_id)
        except AirflowNotFoundException as exc:
            self._missing(exc)
            conn = None
        return self._settings_from(conn)

    def for_trigger(self) -> dict[str, Any] | None:
        """The connection this hook read, for the trigger its task defers to (``{}``: there is none by
        that id), so that the triggerer need not look it up (see the module docstring); ``None`` when
        the trigger must look it up itself: its fields hold a secret and Airflow would show the
        trigger's arguments to whoever may read the task instance (before 3.3)."""
        self.get_settings()
        read = self._read
        if read is None or TRIGGER_KWARGS_PRIVATE or not _secret_values(read):
            return read
        return None

    async def aget_settings(self, connection: dict[str, Any] | None = None) -> DibsSettings:
        """:meth:`get_settings` for the event loop: the connection is fetched with the async SDK call,
        unless the task handed it over (``connection``, from :meth:`for_trigger`).

        Parsing runs in dibs's I/O executor: reading a connection's extra registers its values with the
        secrets masker through a *blocking* call to the supervisor, which must not run on the loop (and
        the loop's default executor is the triggerer's own).
        """
        if self._settings is not None:
            return self._settings
        if connection is not None:
            # As the task read it when it deferred: no lookup. Parsed in asgiref's thread (as below),
            # once for all the triggers that start together with the same connection: a thousand
            # deferred tasks are a thousand triggers, and each would otherwise hop to that thread (one
            # thread, taking them one by one) and log the same store (issue 30).
            def given() -> DibsSettings:
                return self._settings_from(_given(self.dibs_conn_id, connection), ", as its task read it")

            as_read = json.dumps(connection, sort_keys=True, default=str)
            self._settings = await _SHARED_LOOKUPS.get(
                self.dibs_conn_id, sync_to_async(given), handed=as_read
            )
            # Parsed and logged once for them all: each trigger names it in its own first line.
            self._how = ", as its task read it"
            return self._settings
        self._settings = await _SHARED_LOOKUPS.get(self.dibs_conn_id, self._fetch_settings)
        return self._settings

    async def _fetch_settings(self) -> DibsSettings:
        try:
            conn: Connection | None = await self.aget_connection(self.dibs_conn_id)
        except AirflowNotFoundException as exc:
            self._missing(exc)
            conn = None
        # asgiref's thread, not asyncio.to_thread: Airflow before 3.3 routes a worker thread's blocking
        # supervisor call back to the triggerer's loop only from an asgiref thread; from any other it
        # talks to the supervisor concurrently with the loop and the triggerer dies ("Response read
        # out of order").
        return await sync_to_async(self._settings_from)(conn)

    @property
    def wait_timeout(self) -> float | None:
        """The connection's wait timeout (``None``: wait as long as the holder's lease lives)."""
        return self.get_settings().wait_timeout

    # -- clients ----------------------------------------------------------------------------------
    def get_client(self) -> Reservations:
        """A client (cheap: it shares the process's store); close it, or use it as a context manager."""
        stats.install()  # this process's calls show in Airflow's metrics
        return self.get_settings().client(namespace=self.namespace, ttl=self.ttl)

    def get_conn(self) -> Reservations:
        """Airflow's conventional name for :meth:`get_client`."""
        return self.get_client()

    async def aget_client(self, connection: dict[str, Any] | None = None) -> AsyncReservations:
        """An async client for the triggerer; close it with ``await hook.aclose(client)``.
        ``connection``: the connection as the task read it (:meth:`for_trigger`), so it is not looked up.

        The process's first client of a store imports its driver and builds its pool: that runs in
        dibs's I/O executor, never on the loop. The triggers that wait at the same time on one
        connection (the same checked settings, namespace and ttl) share one client, so a thousand
        deferred tasks cost one client, not a thousand (their settings, serializer, observers: issue
        20); it is closed when the last of them closes it.
        """
        stats.install()  # the triggerer's store operations show in Airflow's metrics
        await take_turn()  # a thousand triggers starting together start a bounded batch per iteration
        settings = await self.aget_settings(connection)
        payloads = settings.payloads_url or os.environ.get(PAYLOADS_URL_ENV) or None
        share = (settings, self.namespace, self.ttl, payloads)
        client = _SHARED_CLIENTS.take(share)
        if client is not None:
            return client
        if runtime().has_store(settings.store_url) and (payloads is None or is_open(payloads)):
            # Shared already: building a client imports and sends nothing.
            built = settings.client(namespace=self.namespace, ttl=self.ttl)
        else:
            build = functools.partial(settings.client, namespace=self.namespace, ttl=self.ttl)
            building = asyncio.get_running_loop().run_in_executor(runtime().executor(), build)
            try:
                # Shielded: a trigger cancelled meanwhile must not lose a client still being built.
                built = await asyncio.shield(building)
            except asyncio.CancelledError:
                building.add_done_callback(_close_built)  # nobody will use it: give its store back
                raise
        return _SHARED_CLIENTS.keep(share, built.aio())

    @staticmethod
    async def aclose(client: AsyncReservations) -> None:
        _SHARED_CLIENTS.give_back(client)  # gives its share of the store back once unused: no I/O

    def test_connection(self) -> tuple[bool, str]:
        """Open the store and read one key: what ``airflow connections test`` and the UI call."""
        settings: DibsSettings | None = None
        try:
            settings = self.get_settings()
            with settings.client(namespace=self.namespace, ttl=self.ttl) as client:
                client.status("dibs-connection-test")
        except Exception as exc:  # the UI shows the message; it must never be a traceback
            message = f"{type(exc).__name__}: {exc}"
            # dibs' own messages carry no secret; a driver's text in one might, and the UI does not mask.
            secrets = url_secrets(settings.store_url) if settings is not None else ()
            return False, markup_proof(hide_secrets(message, secrets))
        return True, f"dibs store {settings.display_url} is reachable (namespace {settings.namespace!r})"


class _SharedLookups:
    """One connection lookup (or one parse of the connection a task handed its trigger) for the
    triggers of one event loop that start together.

    The first trigger to ask starts the fetch as a task of its own (cancelling that trigger does not
    cancel the others' lookup); every trigger asking meanwhile waits for it, and they are woken in
    bounded batches (:func:`dibs.integration.resolve_in_batches`). Nothing is kept once the lookup has
    ended: a trigger that starts later sees the connection as it is then.
    """

    def __init__(self) -> None:
        self._waiting: dict[
            tuple[asyncio.AbstractEventLoop, str, str], list[asyncio.Future[DibsSettings]]
        ] = {}

    async def get(
        self, conn_id: str, fetch: Callable[[], Coroutine[Any, Any, DibsSettings]], *, handed: str = ""
    ) -> DibsSettings:
        """The settings ``fetch`` returns, fetched once for every trigger asking for ``conn_id`` (with
        the same connection ``handed`` over by its task, as JSON: ``""`` for a lookup) until it returns."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[DibsSettings] = loop.create_future()
        key = (loop, conn_id, handed)
        waiting = self._waiting.get(key)
        if waiting is None:
            waiting = self._waiting[key] = []
            task: asyncio.Task[DibsSettings] = loop.create_task(fetch())
            task.add_done_callback(lambda done: self._settle(key, done))
        waiting.append(future)
        return await future

    def _settle(
        self, key: tuple[asyncio.AbstractEventLoop, str, str], done: asyncio.Task[DibsSettings]
    ) -> None:
        loop, conn_id, _ = key
        waiting = self._waiting.pop(key, [])
        if done.cancelled():
            error: BaseException | None = asyncio.CancelledError(
                f"looking up connection {conn_id!r} was cancelled"
            )
            settings = None
        else:
            error = done.exception()
            settings = None if error is not None else done.result()
        resolve_in_batches(loop, [(future, settings, error) for future in waiting])


_SHARED_LOOKUPS = _SharedLookups()


def _close_built(done: asyncio.Future[Reservations]) -> None:
    if not done.cancelled() and done.exception() is None:
        done.result().close()


class _SharedClients:
    """The async clients in use in this process, one per ``(settings, namespace, ttl, payloads)``,
    each with the number of triggers using it; the last one to give it back closes it.

    Keyed by the checked settings' value, so triggers whose lookups returned the same connection
    share a client, and a changed connection gets a client of its own. Settings that cannot be hashed
    (a custom serializer object, say) are not shared.

    Each trigger gets a handle of its own (a shallow copy sharing the client and its I/O helpers), so
    that giving one back twice gives back one share, not another trigger's; and a client somebody
    closed directly is dropped, never handed to a new trigger.
    """

    def __init__(self) -> None:
        self._forget_after_fork()

    def _forget_after_fork(self) -> None:
        # A forked child must not share the parent's clients (their stores were forgotten with dibs's
        # runtime), nor wait for a lock a parent's thread held when it forked.
        self._lock = threading.Lock()
        self._clients: dict[Hashable, list[Any]] = {}  # share -> [client, users]
        self._handles: dict[int, tuple[Any, AsyncReservations]] = {}  # id(handle) -> (share, handle)

    def _handle(self, share: Any, client: AsyncReservations) -> AsyncReservations:
        handle = copy.copy(client)
        self._handles[id(handle)] = (share, handle)
        return handle

    def take(self, share: Hashable) -> AsyncReservations | None:
        """A handle on the client of ``share``, with one user more, if there is an open one."""
        try:
            with self._lock:
                entry = self._clients.get(share)
                if entry is None:
                    return None
                if entry[0].client._closed:  # closed by hand: its users keep it, nobody new gets it
                    del self._clients[share]
                    return None
                entry[1] += 1
                return self._handle(share, entry[0])
        except TypeError:  # unhashable settings: each trigger builds its own
            return None

    def keep(self, share: Hashable, client: AsyncReservations) -> AsyncReservations:
        """A handle on ``client``, just built for ``share``, with its first user; or, if another trigger
        built one meanwhile, on that one (and ``client`` is closed)."""
        try:
            with self._lock:
                entry = self._clients.get(share)
                if entry is None or entry[0].client._closed:
                    self._clients[share] = [client, 1]
                    return self._handle(share, client)
                entry[1] += 1
                kept = self._handle(share, entry[0])
        except TypeError:
            with self._lock:
                return self._handle(None, client)  # its trigger's own, closed when given back
        client.client.close()
        return kept

    def give_back(self, handle: AsyncReservations) -> None:
        """Give ``handle``'s share back (once: again, or a handle not from here, does nothing)."""
        with self._lock:
            # A registered handle is kept alive by the table, so its id is nobody else's meanwhile.
            found = self._handles.pop(id(handle), None)
            if found is None:
                return
            share = found[0]
            entry = self._clients.get(share) if share is not None else None
            if entry is not None and entry[0].client is handle.client:
                entry[1] -= 1
                if entry[1] > 0:
                    return
                del self._clients[share]
        # The last user, an unshared client, or one dropped as closed (closing again does nothing).
        handle.client.close()


_SHARED_CLIENTS = _SharedClients()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_SHARED_CLIENTS._forget_after_fork)
