"""Stores, chosen by URL. Each store module is imported only when its URL is used, so ``import dibs``
never pulls in a database driver or a cloud SDK.

==========================  =========================================================
URL                          store
==========================  =========================================================
``sqlite:///path.db``        :class:`dibs.stores.sql.SQLStore` (embedded default)
``postgresql+psycopg://…``   :class:`dibs.stores.sql.SQLStore` (``postgres`` extra)
``mysql+pymysql://…``        :class:`dibs.stores.sql.SQLStore` (``mysql`` extra)
``redis://host:port/db``     :class:`dibs.stores.redis.RedisStore` (``redis`` extra)
``azure://container/prefix`` :class:`dibs.stores.azure.AzureBlobStore` (``azure`` extra)
``file:///shared/dir``       :class:`dibs.stores.filesystem.FileStore`
``memory://name``            :class:`dibs.stores.memory.MemoryStore` (one process only)
==========================  =========================================================
"""

from __future__ import annotations

import importlib
import re
from typing import Protocol, cast

from dibs.errors import ConfigurationError
from dibs.stores.base import Store

__all__ = ["STORE_SCHEMES", "Store", "open_store", "redact_url"]

#: URL scheme (the part before ``+driver``) → ``module:Class``.
STORE_SCHEMES: dict[str, str] = {
    "sqlite": "dibs.stores.sql:SQLStore",
    "postgresql": "dibs.stores.sql:SQLStore",
    "postgres": "dibs.stores.sql:SQLStore",
    "mysql": "dibs.stores.sql:SQLStore",
    "mariadb": "dibs.stores.sql:SQLStore",
    "redis": "dibs.stores.redis:RedisStore",
    "rediss": "dibs.stores.redis:RedisStore",
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
    "azure": "azure",
}


class _FromURL(Protocol):
    def from_url(self, url: str) -> Store: ...


_SECRET_QUERY = re.compile(
    r"((?:password|secret|key|token|sas|sig|credential|connection_string)[^=&]*=)[^&]*", re.IGNORECASE
)

_NESTED_USERINFO = re.compile(r"(//[^/@:?&#]*:)[^@/?&#]*@")


def redact_url(url: str) -> str:
    """``url`` with its password and secret-looking query values replaced by ``***``, for logs.

    The user part ends at the *last* ``@`` before the query, so a password containing ``@``, ``:``
    or ``/`` is hidden whole.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return _SECRET_QUERY.sub(_hide, url)
    query_at = min((i for i in (rest.find("?"), rest.find("#")) if i != -1), default=len(rest))
    at = rest.rfind("@", 0, query_at)
    if at != -1 and not rest.startswith("/"):
        userinfo, rest = rest[:at], rest[at + 1 :]
        user, has_password, _ = userinfo.partition(":")
        rest = f"{user}:***@{rest}" if has_password else f"{user}@{rest}"
    # A URL inside a query value (``account_url=https://user:pw@host``) may carry a password too.
    rest = _NESTED_USERINFO.sub(r"\1***@", rest)
    return f"{scheme}://{_SECRET_QUERY.sub(_hide, rest)}"


def _hide(match: re.Match[str]) -> str:
    return f"{match.group(1)}***"


def open_store(url: str) -> Store:
    """The store a URL names. Unknown schemes and missing extras get an error that says what to do."""
    if not isinstance(url, str) or "://" not in url:
        raise ConfigurationError(
            f"store URL {redact_url(str(url))!r} is not a URL; expected e.g. 'sqlite:///path/dibs.db', "
            "'postgresql+psycopg://user@host/db', 'redis://localhost:6379/0', 'file:///shared/dir', "
            "'azure://container/prefix?account_url=...'"
        )
    scheme = url.split("://", 1)[0].split("+", 1)[0].lower()
    # A bare mysql:// or mariadb:// means PyMySQL, which dibs[mysql] installs (SQLAlchemy's default: MySQLdb).
    url = re.sub(r"^(mysql|mariadb)://", r"\1+pymysql://", url, flags=re.I)
    target = STORE_SCHEMES.get(scheme)
    if target is None:
        raise ConfigurationError(
            f"unknown store scheme {scheme!r} in {redact_url(url)!r}; known schemes: "
            + ", ".join(sorted(STORE_SCHEMES))
        )
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
