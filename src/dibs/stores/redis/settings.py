"""The Redis store's connection: the URL's options, checked before redis-py sees them, and the
client defaults they override.

URL: ``redis://[user:password@]host[:port][/db][?prefix=dibs:&socket_timeout=10]`` (``rediss://`` for
TLS). ``prefix`` (default ``dibs:``) starts every Redis key dibs writes; ``max_artifact_size`` (bytes)
sets a limit below the server's own; any other query option is handed to redis-py's connection pool,
but ``decode_responses`` (the store reads replies as bytes).
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Callable
from typing import Any

from redis.backoff import NoBackoff
from redis.retry import Retry

from dibs.config import validate_seconds
from dibs.errors import ConfigurationError
from dibs.stores import url_userinfo

__all__ = ["CLIENT_DEFAULTS", "DEFAULT_MAX_CONNECTIONS", "DEFAULT_PREFIX", "SCAN_BATCH", "parse_url"]

DEFAULT_PREFIX = "dibs:"
# Only characters that mean nothing to SCAN's glob MATCH, so a prefix can never select foreign keys.
_PREFIX_RE = re.compile(r"[A-Za-z0-9_.:/|-]{1,100}")
# Connection defaults; the URL's query options override them (redis-py lets the URL win).
CLIENT_DEFAULTS: dict[str, Any] = {
    "socket_connect_timeout": 5.0,
    "socket_timeout": 10.0,
    # A PING before reusing a connection idle this long finds dead sockets before a script is sent.
    "health_check_interval": 30,
    # No transparent retries: a script whose reply was lost may have run, and running complete or
    # release twice would turn a success into a LeaseLost. The caller's policy retries instead.
    "retry": Retry(NoBackoff(), 0),
}
#: Keys per SCAN round trip and per pipeline of reads; also the most channels one feed call takes.
SCAN_BATCH = 500
#: Connections per store and process, the watch hub's subscription included (``?max_connections=``).
DEFAULT_MAX_CONNECTIONS = 4


#: Query options that are durations in seconds (``True``: 0 is allowed, it turns the option off).
_DURATIONS = {"socket_timeout": False, "socket_connect_timeout": False, "health_check_interval": True}


def _check_duration(name: str, text: str, bad: Callable[[str], ConfigurationError]) -> None:
    """A duration option through the one rule for durations; redis-py would accept NaN or 1e300 and
    fail later, inside a socket call, with ``OverflowError``."""
    try:
        value = float(text)
    except ValueError:
        raise bad(f"{name}={text!r} is not a number of seconds") from None
    try:
        validate_seconds(name, value, allow_zero=_DURATIONS[name])
    except ConfigurationError as exc:
        raise bad(exc.message) from None


def parse_url(url: str, redacted: str) -> tuple[str, str, int | None]:
    """Split the store URL into the URL redis-py gets, the key prefix and ``max_artifact_size``,
    checking what dibs can."""

    def bad(problem: str) -> ConfigurationError:
        return ConfigurationError(
            f"invalid Redis store URL {redacted!r}: {problem}; expected "
            "'redis://[user:password@]host[:port][/db][?prefix=dibs:]' or 'rediss://...' for TLS",
            url=redacted,
        )

    if not isinstance(url, str):
        raise bad(f"a URL must be a string, got {type(url).__name__}")
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError as exc:
        raise bad(str(exc)) from exc
    userinfo = url_userinfo(url)
    if userinfo is not None and ":" in userinfo and not parts.netloc.startswith(userinfo + "@"):
        # redis-py splits the host off at the first '/', '?' or '#': an unencoded password holding one
        # would be sent cut short, and its tail quoted back as a database number, a port or a host.
        raise bad(
            "its password (or an option value after it) contains an unencoded '/', '?', '#' or '@'; "
            "percent-encode them (%2F, %3F, %23, %40). The password is not shown"
        )
    try:
        parts.port  # noqa: B018 -- urllib checks the port only when asked
    except ValueError as exc:
        raise bad(str(exc)) from exc
    if parts.scheme.lower() not in {"redis", "rediss"}:
        raise bad(f"the scheme is {parts.scheme!r}, not 'redis' or 'rediss'")
    if parts.path not in {"", "/"} and not re.fullmatch(r"/\d+", parts.path):
        raise bad(f"the database {parts.path.lstrip('/')!r} is not a number (use e.g. '/0')")
    kept, prefixes = [], []
    max_size: int | None = None
    for item in parts.query.split("&") if parts.query else []:
        name, _, value = item.partition("=")
        if urllib.parse.unquote(name) == "prefix":
            prefixes.append(urllib.parse.unquote(value))
        elif urllib.parse.unquote(name) == "max_artifact_size":
            text = urllib.parse.unquote(value)
            if not text.isdigit() or int(text) < 1:
                raise bad(f"max_artifact_size={text!r} is not a whole number of bytes, 1 or more")
            max_size = int(text)
        elif urllib.parse.unquote(name) == "decode_responses":
            # redis-py would hand every reply over as str; the store reads bytes (payloads are bytes).
            raise bad(
                f"decode_responses={urllib.parse.unquote(value)!r}: dibs reads replies as bytes; leave it out"
            )
        elif urllib.parse.unquote(name) in _DURATIONS:
            _check_duration(urllib.parse.unquote(name), urllib.parse.unquote(value), bad)
            kept.append(item)
        else:
            kept.append(item)  # handed on byte for byte: redis-py unquotes the values itself
    if len(prefixes) > 1:
        raise bad(f"'prefix' is given {len(prefixes)} times")
    prefix = prefixes[0] if prefixes else DEFAULT_PREFIX
    if not _PREFIX_RE.fullmatch(prefix):
        raise bad(
            f"the prefix {prefix!r} is not 1 to 100 of letters, digits and '_.:/|-' (e.g. 'dibs:' or "
            "'team-a:dibs:')"
        )
    return urllib.parse.urlunsplit(parts._replace(query="&".join(kept))), prefix, max_size
