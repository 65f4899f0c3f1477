"""Stores, chosen by URL. Each store module is imported only when its URL is used, so ``import dibs``
never pulls in a database driver or a cloud SDK.

==========================  =========================================================
URL                          store
==========================  =========================================================
``sqlite:///path.db``        :class:`dibs.stores.sql.SQLStore` (embedded default)
``postgresql+psycopg://…``   :class:`dibs.stores.sql.SQLStore` (``postgres`` extra)
``mysql+pymysql://…``        :class:`dibs.stores.sql.SQLStore` (``mysql`` extra)
``redis://host:port/db``     :class:`dibs.stores.redis.RedisStore` (``redis`` extra)
``redis+cluster://h:p,h:p``  the same, on a Redis Cluster (``rediss+cluster://`` for TLS)
``redis+sentinel://h:p/db``  the same, on the master a Sentinel set names (``?service_name=``)
``azure://container/prefix`` :class:`dibs.stores.azure.AzureBlobStore` (``azure`` extra)
``file:///shared/dir``       :class:`dibs.stores.filesystem.FileStore`
``memory://name``            :class:`dibs.stores.memory.MemoryStore` (one process only)
==========================  =========================================================
"""

from __future__ import annotations

import importlib
import re
import urllib.parse
from typing import Protocol, cast

from dibs.errors import ConfigurationError
from dibs.stores.base import Store
from dibs.stores.requests import AcquireRequest, NewArtifact

__all__ = [
    "STORE_SCHEMES",
    "AcquireRequest",
    "NewArtifact",
    "Store",
    "checked_url_text",
    "hide_secrets",
    "open_store",
    "redact_url",
    "url_secrets",
    "url_userinfo",
]

#: URL scheme → ``module:Class``: the whole scheme (``redis+cluster``), else the part before ``+driver``
#: (``postgresql+psycopg`` is ``postgresql``).
STORE_SCHEMES: dict[str, str] = {
    "sqlite": "dibs.stores.sql:SQLStore",
    "postgresql": "dibs.stores.sql:SQLStore",
    "postgres": "dibs.stores.sql:SQLStore",
    "mysql": "dibs.stores.sql:SQLStore",
    "mariadb": "dibs.stores.sql:SQLStore",
    "redis": "dibs.stores.redis:RedisStore",
    "rediss": "dibs.stores.redis:RedisStore",
    "redis+cluster": "dibs.stores.redis:RedisStore",
    "rediss+cluster": "dibs.stores.redis:RedisStore",
    "redis+sentinel": "dibs.stores.redis:RedisStore",
    "rediss+sentinel": "dibs.stores.redis:RedisStore",
    "azure": "dibs.stores.azure:AzureBlobStore",
    "file": "dibs.stores.filesystem:FileStore",
    "memory": "dibs.stores.memory:MemoryStore",
}

_EXTRAS = {
    "postgresql": "postgres",
    "postgres": "postgres",
    "mysql": "mysql",
    "mariadb": "mysql",
    "redis": "redis",
    "rediss": "redis",
    "redis+cluster": "redis",
    "rediss+cluster": "redis",
    "redis+sentinel": "redis",
    "rediss+sentinel": "redis",
    "azure": "azure",
}


class _FromURL(Protocol):
    def from_url(self, url: str) -> Store: ...


_SECRET_QUERY = re.compile(
    r"((?:password|passwd|pwd|secret|key|token|sas|sig|credential|connection_string)[^=&]*=)[^&]*",
    re.IGNORECASE,
)

# A URL nested in a query value (``account_url=https://user:pw@host``): its password runs to the last
# ``@`` of the text, so it may contain ``/``, ``?``, ``#``, ``&`` or ``@`` (an unencoded ``&`` would end
# the value for a parser, but may well be part of the password).
_NESTED_URL = re.compile(r"=[A-Za-z][A-Za-z0-9+.-]*://")
_NESTED_USERINFO = re.compile(r"(//[^/@:?&#\s]*:)\S*@")
# The same, percent-encoded as a query value (``listen_url=postgresql%3A%2F%2Fuser%3Apw%40host``, as
# SQLAlchemy writes a URL in a URL): the password runs from the user's encoded ``:`` to the last
# encoded ``@`` before the value ends (an ``&`` of the nested URL would be encoded too).
_ENCODED_NESTED = re.compile(r"%3A%2F%2F", re.IGNORECASE)


def _encoded_nested_passwords(rest: str) -> list[tuple[int, int]]:
    """Where the passwords of percent-encoded nested URLs are in ``rest``: (start, end) pairs."""
    spans = []
    for nested in _ENCODED_NESTED.finditer(rest):
        start = nested.end()
        end = rest.find("&", start)
        value = rest[start : len(rest) if end == -1 else end].upper()
        at = value.rfind("%40")
        colon = value.find("%3A", 0, at) if at != -1 else -1
        if colon != -1:
            spans.append((start + colon + 3, start + at))
    return spans


def _userinfo_end(rest: str) -> int:
    """Where the user part of ``rest`` (a URL after ``scheme://``) ends: the index of its ``@``, or -1.

    Passwords are often pasted unencoded, and then may contain ``/``, ``?``, ``#`` or ``@`` too, so the
    user part is taken to run to the *last* ``@`` (before any URL nested in a query value), not to the
    first ``/``, ``?`` or ``#`` as RFC 3986 would have it. An ``@`` inside a query value after a
    ``host:port`` then hides more than the password: for logs, hiding too much is the safe mistake.
    """
    if rest.startswith("/"):  # sqlite:///path, file:///path: no authority at all
        return -1
    nested = _NESTED_URL.search(rest)
    if nested is None:
        return rest.rfind("@")
    before = rest.rfind("@", 0, nested.start())
    if before == -1 and ":" in rest[: nested.start()]:
        # No '@' before the "nested URL", but a ':' that may start a password: the "nested URL" may
        # be part of that password (``u:X?y=A://B@host``). Hide to the last '@' (safe, if too much).
        return rest.rfind("@")
    return before


def url_userinfo(url: str) -> str | None:
    """The user part of ``url`` (``user:password``, as written) by :func:`redact_url`'s rule, or ``None``.

    Stores compare it with what their driver's parser took, to refuse a URL whose unencoded password
    the driver would split differently (and then quote a piece of it as a host or a port).
    """
    _, sep, rest = url.partition("://")
    at = _userinfo_end(rest if sep else url)
    if not sep:
        return url[:at] if at != -1 else None
    return rest[:at] if at != -1 else None


def url_secrets(url: str) -> tuple[str, ...]:
    """The secret values in ``url`` (its password, secret-looking query values), as written and decoded.

    For :func:`hide_secrets`: a driver's message may quote them in either form. A query secret is
    given both as a driver would cut it (at the next ``&``) and as :func:`redact_url` hides it (to
    the end of the URL: an unencoded ``&`` may be part of it).
    """
    found: list[str] = []
    userinfo = url_userinfo(url)
    if userinfo is not None and ":" in userinfo:
        found.append(userinfo.partition(":")[2])
    for match in _SECRET_QUERY.finditer(url):
        found.append(match.group(0)[len(match.group(1)) :])
        found.append(url[match.end(1) :])
    for nested in _NESTED_USERINFO.finditer(url):  # a URL in a query value: its password, as written
        found.append(url[nested.end(1) : nested.end() - 1])
    for start, end in _encoded_nested_passwords(url):  # the same, percent-encoded: decoded twice too
        found.append(url[start:end])
        found.append(urllib.parse.unquote(urllib.parse.unquote(url[start:end])))
    decoded = [urllib.parse.unquote(value) for value in found]
    return tuple(dict.fromkeys(value for value in (*found, *decoded) if value))


def hide_secrets(text: str, secrets: tuple[str, ...]) -> str:
    """``text`` with each of ``secrets`` (and its percent-encoded form) replaced by ``***``.

    Secrets shorter than 4 characters are left alone: replacing them would garble every message
    without protecting anything (redaction of the URL itself does not depend on this).
    """
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= 4:
            text = text.replace(secret, "***").replace(urllib.parse.quote(secret, safe=""), "***")
    return text


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")


def redact_url(url: object) -> str:
    """``url`` with every part that may be secret replaced by ``***``: the one way dibs shows a URL.

    Every message, ``repr``, ``store.url``, log line and CLI line that names a store URL shows it
    through here. Passwords are often pasted unencoded, so each rule hides the widest span the
    secret might cover, and a character that two rules disagree about is hidden (for logs, hiding
    too much is the safe mistake):

    * the password of the user part: from the first ``:`` of the user part to the *last* ``@`` (see
      :func:`_userinfo_end`), so one holding ``@``, ``:``, ``/``, ``?`` or ``#`` is hidden whole;
    * a secret-looking query value (``password=``, ``sas_token=``, ``sig=``, ...): to the end of the
      URL, since an unencoded ``&``, ``#`` or ``@`` may be part of it (later options are hidden too);
    * the password of a URL nested in a query value (``account_url=https://user:pw@host``).

    Text without ``://`` (a mistyped ``redis:/:pw@host``, a ``user:pw@host``) gets the same treatment
    from its start. The result never raises, whatever the input (not even for a non-string).
    """
    text = str(url)
    scheme, sep, rest = text.partition("://")
    if not sep or not _SCHEME.fullmatch(scheme):  # "0://..." is no scheme (RFC 3986: a letter first)
        scheme, sep, rest = "", "", text
    hidden = [False] * len(rest)

    def hide(start: int, end: int) -> None:
        hidden[start:end] = [True] * (end - start)

    at = _userinfo_end(rest)
    if at != -1:
        colon = rest.find(":", 0, at)
        if colon != -1:
            hide(colon + 1, at)
    for nested in _NESTED_USERINFO.finditer(rest):
        hide(nested.end(1), nested.end() - 1)
    for start, end in _encoded_nested_passwords(rest):
        hide(start, end)
    query_secret = _SECRET_QUERY.search(rest)
    if query_secret is not None:
        hide(query_secret.end(1), len(rest))
    shown: list[str] = []
    for index, char in enumerate(rest):
        if not hidden[index]:
            shown.append(char)
        elif index == 0 or not hidden[index - 1]:
            shown.append("***")
    redacted = "".join(shown)
    return f"{scheme}://{redacted}" if sep else redacted


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def checked_url_text(url: str, what: str = "store URL") -> str:
    """``url`` when it holds no control character; else a :class:`ConfigurationError` naming it
    (redacted, the character escaped). A NUL or an escape in a URL is never what was meant: a driver
    would fail on it with an error of its own (``embedded null byte``), or make a file whose name
    holds it, and a terminal would act on it when the URL is shown."""
    found = _CONTROL.search(url)
    if found is not None:
        raise ConfigurationError(
            f"{what} {redact_url(url)!r} holds a control character ({found.group()!r} at position "
            f"{found.start()}); a URL never does: check how it was quoted or pasted"
        )
    return url


def open_store(url: str) -> Store:
    """The store a URL names. Unknown schemes and missing extras get an error that says what to do."""
    if isinstance(url, str):
        checked_url_text(url)
    if not isinstance(url, str) or "://" not in url:
        raise ConfigurationError(
            f"store URL {redact_url(str(url))!r} is not a URL; expected e.g. 'sqlite:///path/dibs.db', "
            "'postgresql+psycopg://user@host/db', 'redis://localhost:6379/0', 'file:///shared/dir', "
            "'azure://container/prefix?account_url=...'"
        )
    scheme = url.split("://", 1)[0].lower()
    if scheme not in STORE_SCHEMES:
        scheme = scheme.split("+", 1)[0]
    # A bare mysql:// or mariadb:// means PyMySQL, which dibs[mysql] installs (SQLAlchemy's default: MySQLdb).
    url = re.sub(r"^(mysql|mariadb)://", r"\1+pymysql://", url, flags=re.I)
    target = STORE_SCHEMES.get(scheme)
    if target is None:
        return _open_registered(url)
    module_name, class_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        extra = _EXTRAS.get(scheme)
        hint = f"; install it with: pip install 'dibs[{extra}]'" if extra else ""
        raise ConfigurationError(
            f"the {scheme!r} store needs a package that is not installed ({exc.name}){hint}"
        ) from exc
    store_class = cast(_FromURL, getattr(module, class_name))
    return store_class.from_url(url)


def _open_registered(url: str) -> Store:
    """The store of a scheme another package registers (:mod:`dibs.stores.plugins`): the whole
    scheme (``myco+fast``), else the part before ``+``."""
    from dibs.stores import plugins  # reads packages' metadata: only for a scheme dibs does not know

    whole = url.split("://", 1)[0].lower()
    for scheme in dict.fromkeys((whole, whole.split("+", 1)[0])):
        store_class = plugins.load(plugins.STORES, scheme, Store, "store")
        if store_class is None:
            continue
        store = store_class.from_url(url)
        if not isinstance(store, Store):
            raise ConfigurationError(
                f"the store scheme {scheme!r}: {store_class.__qualname__}.from_url returned a "
                f"{type(store).__qualname__}, not a dibs.stores.Store"
            )
        return store
    raise ConfigurationError(
        f"unknown store scheme {whole!r} in {redact_url(url)!r}; known schemes: "
        + plugins.known(plugins.STORES, list(STORE_SCHEMES))
        + " (a package registers another in the entry point group 'dibs.stores')"
    )
