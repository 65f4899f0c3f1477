"""What an ``azure://`` URL says: :func:`parse_url` checks it into :class:`AzureSettings`, contacting
nothing (connecting is :func:`dibs.stores.azure.connection.connect`'s business)::

    azure://CONTAINER[/PREFIX]?account_url=https://ACCOUNT.blob.core.windows.net[&OPTIONS]

The parameters, the credential order and the options are described in :mod:`dibs.stores.azure`.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import math
import re
from collections.abc import Mapping
from urllib.parse import parse_qsl, unquote, urlsplit

from dibs.errors import ConfigurationError
from dibs.stores import redact_url

__all__ = [
    "CONNECTION_STRING_ENV",
    "DEFAULT_MAX_CONCURRENCY",
    "DEFAULT_RETRIES",
    "DEFAULT_TIMEOUT",
    "EXAMPLE_URL",
    "AzureSettings",
    "parse_url",
]

CONNECTION_STRING_ENV = "AZURE_STORAGE_CONNECTION_STRING"
EXAMPLE_URL = "azure://my-container/optional/prefix?account_url=https://myaccount.blob.core.windows.net"

DEFAULT_TIMEOUT = 30.0
DEFAULT_RETRIES = 3
DEFAULT_MAX_CONCURRENCY = 4

_CONTAINER_RE = re.compile(r"[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){2,62}")
_PREFIX_SEGMENT_RE = re.compile(r"[A-Za-z0-9_.=-]{1,100}")
_KNOWN_PARAMS = (
    "account_url",
    "connection_string",
    "account_key",
    "sas_token",
    "timeout",
    "retries",
    "max_concurrency",
)
_SECRET_PARAMS = frozenset({"connection_string", "account_key", "sas_token"})
# Query fields of a SAS token: seeing them as URL parameters means the token was not percent-encoded.
_SAS_FIELDS = frozenset(
    {
        "sv",
        "ss",
        "srt",
        "sp",
        "se",
        "st",
        "spr",
        "sig",
        "sr",
        "si",
        "sdd",
        "skoid",
        "sktid",
        "skt",
        "ske",
        "sks",
        "skv",
        "saoid",
        "suoid",
        "scid",
        "ses",
    }
)


@dataclasses.dataclass(frozen=True)
class AzureSettings:
    """What an ``azure://`` URL says. Secrets are excluded from ``repr`` so the object is safe to log."""

    container: str
    prefix: str = ""
    account_url: str | None = None
    connection_string: str | None = dataclasses.field(default=None, repr=False)
    account_key: str | None = dataclasses.field(default=None, repr=False)
    sas_token: str | None = dataclasses.field(default=None, repr=False)
    timeout: float = DEFAULT_TIMEOUT
    retries: int = DEFAULT_RETRIES
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY

    @property
    def secrets(self) -> tuple[str, ...]:
        return tuple(s for s in (self.connection_string, self.account_key, self.sas_token) if s)


def _bad_url(url: str, problem: str) -> ConfigurationError:
    return ConfigurationError(
        f"invalid Azure store URL {redact_url(url)!r}: {problem}; expected for example {EXAMPLE_URL!r}",
        url=redact_url(url),
    )


def _parse_container(url: str, container: str) -> str:
    if not container:
        raise _bad_url(url, "the container name is missing")
    if "@" in container:  # user:password@...: never echo it, and say where credentials go
        raise _bad_url(
            url,
            "credentials do not belong before the container name; pass connection_string=, "
            "account_key= or sas_token= as parameters (or use DefaultAzureCredential)",
        )
    if not _CONTAINER_RE.fullmatch(container):
        raise _bad_url(
            url,
            f"{container!r} is not a valid container name (3 to 63 lowercase letters, digits and single "
            "hyphens, starting and ending with a letter or digit)",
        )
    return container


def parse_url(url: str) -> AzureSettings:
    """Validate an ``azure://`` URL into :class:`AzureSettings`; :class:`ConfigurationError` if it is wrong.

    Nothing is contacted: connecting is :meth:`~dibs.stores.azure.AzureBlobStore.from_url`'s business.
    """
    if not isinstance(url, str) or not url.startswith("azure://"):
        raise _bad_url(str(url), "it does not start with 'azure://'")
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise _bad_url(url, f"it cannot be parsed ({exc})") from None
    if parts.fragment:
        raise _bad_url(url, "it contains '#': percent-encode it as %23 inside parameter values")
    container = _parse_container(url, parts.netloc)
    prefix = _parse_prefix(url, parts.path)

    # '+' is literal here (account keys and connection strings are base64 and contain it), not a space.
    try:
        pairs = parse_qsl(parts.query.replace("+", "%2B"), keep_blank_values=True, strict_parsing=False)
    except ValueError as exc:
        raise _bad_url(url, f"its query cannot be parsed ({exc})") from None
    params: dict[str, str] = {}
    for name, value in pairs:
        if name in params:
            raise _bad_url(url, f"parameter {name!r} is given twice")
        params[name] = value
    unknown = sorted(set(params) - set(_KNOWN_PARAMS))
    if unknown:
        hint = ""
        if set(unknown) & _SAS_FIELDS:
            hint = (
                " (it looks like an unencoded SAS token: percent-encode it, "
                "e.g. sas_token=sv%3D...%26sig%3D...)"
            )
        raise _bad_url(
            url,
            f"unknown parameter(s) {', '.join(map(repr, unknown))}{hint}; known: " + ", ".join(_KNOWN_PARAMS),
        )
    for name in _SECRET_PARAMS | {"account_url"}:
        if name in params and not params[name].strip():
            raise _bad_url(url, f"parameter {name!r} is empty")

    account_url = params.get("account_url")
    if account_url is not None:
        account_url = _check_account_url(url, account_url)
    account_key = params.get("account_key")
    if account_key is not None:
        try:
            base64.b64decode(account_key, validate=True)
        except (binascii.Error, ValueError):
            raise _bad_url(url, "account_key is not valid base64 (its value is not shown)") from None
    sas_token = params.get("sas_token")
    if sas_token is not None:
        sas_token = sas_token.lstrip("?")
    if account_key is not None and sas_token is not None:
        raise _bad_url(url, "give either account_key or sas_token, not both")
    if (account_key is not None or sas_token is not None) and account_url is None:
        raise _bad_url(url, "account_key and sas_token need account_url (the account's blob endpoint)")
    if params.get("connection_string") is not None and (account_key is not None or sas_token is not None):
        raise _bad_url(url, "a connection_string carries its own credential: drop account_key/sas_token")

    return AzureSettings(
        container=container,
        prefix=prefix,
        account_url=account_url,
        connection_string=params.get("connection_string"),
        account_key=account_key,
        sas_token=sas_token,
        timeout=_number(url, params, "timeout", DEFAULT_TIMEOUT, minimum=0.1, maximum=3600),
        retries=int(_number(url, params, "retries", DEFAULT_RETRIES, minimum=0, maximum=20, integer=True)),
        max_concurrency=int(
            _number(
                url, params, "max_concurrency", DEFAULT_MAX_CONCURRENCY, minimum=1, maximum=64, integer=True
            )
        ),
    )


def _parse_prefix(url: str, path: str) -> str:
    """``/a/b/`` → ``a/b/``. Segments are plain words: no ``..``, no empty segment, no odd characters."""
    text = unquote(path).strip("/")
    if not text:
        return ""
    segments = text.split("/")
    for segment in segments:
        if not _PREFIX_SEGMENT_RE.fullmatch(segment) or set(segment) == {"."}:
            raise _bad_url(
                url,
                f"prefix segment {segment!r} is not allowed (use letters, digits, '_', '-', '.', '=' and "
                "'/' between segments; no empty, '.' or '..' segments)",
            )
    if len(text) > 400:
        raise _bad_url(url, "the prefix is longer than 400 characters")
    return text + "/"


def _check_account_url(url: str, account_url: str) -> str:
    try:
        parts = urlsplit(account_url)
    except ValueError:
        raise _bad_url(url, f"account_url {redact_url(account_url)!r} is not a URL") from None
    if parts.scheme not in ("https", "http") or not parts.netloc:
        raise _bad_url(
            url,
            f"account_url {redact_url(account_url)!r} must be an http(s) URL such as "
            "https://myaccount.blob.core.windows.net",
        )
    # Any '@' (not only one in the netloc urlsplit finds: a password holding '/' ends it early).
    if parts.query or parts.fragment or "@" in account_url:
        # A SAS appended to the endpoint would end up in logs with the endpoint: keep it separate.
        raise _bad_url(url, "account_url must not carry a query or user info; pass a SAS as sas_token=")
    return account_url.rstrip("/")


def _number(
    url: str,
    params: Mapping[str, str],
    name: str,
    default: float,
    *,
    minimum: float,
    maximum: float = math.inf,
    integer: bool = False,
) -> float:
    raw = params.get(name)
    if raw is None:
        return default
    kind = "whole number" if integer else "number"
    try:
        value = float(raw)
    except ValueError:
        raise _bad_url(url, f"{name}={raw!r} is not a {kind}") from None
    if integer and not value.is_integer():
        raise _bad_url(url, f"{name}={raw!r} is not a {kind}")
    if not minimum <= value <= maximum:  # also rejects nan
        raise _bad_url(url, f"{name}={raw!r} must be between {minimum:g} and {maximum:g}")
    return value
