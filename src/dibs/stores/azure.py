"""Azure Blob Storage: one small JSON record blob per key, replaced by an ETag compare-and-swap.

Why blobs can hold leases
    Blob storage has conditional writes. A record is created with ``If-None-Match: *`` (only if no
    blob of that name exists) and replaced with ``If-Match: <etag of what I read>``, so when several
    clients read the same version and write, exactly one write lands; the others get HTTP 409 or 412
    and read again. The reservation rules are :mod:`dibs.stores.transitions`, applied between the read
    and the swap by :class:`~dibs.stores.base.RecordStore`; the fencing token lives in the record.
    Azure's own blob leases are not used: their duration is 15 to 60 seconds or infinite, they carry no
    owner or fence, and they cannot be judged against a caller's ttl.

Layout inside the container (``PREFIX`` is optional)::

    PREFIX/records/<sha256 of the key>                 the key's record (dibs.stores.codec JSON)
    PREFIX/artifacts/<sha256 of the key>-<fence>-<h>   a completed key's payload (h: from its checksum)

Names come from :attr:`dibs.keys.Key.digest` only, never from the key's text, so no key can reach
outside the prefix. A record blob is never deleted: ``forget``, ``prune``, ``reap`` and ``discard``
replace it with a tombstone that keeps the fence, so fences (and with them payload names) never
repeat, and a payload delete that arrives late can only hit a blob no record names any more.

Time
    Expiry is judged by the Blob service's clock: every read takes ``now`` from the ``Date`` header of
    its own response, never from this machine's wall clock, so clients whose clocks disagree still
    agree on who holds a key. ``Date`` has one-second resolution, too coarse for short ttls;
    :class:`ServiceClock` refines it with this process's *monotonic* clock (used only to measure the
    time between two of its own requests) down to about a round trip, and always keeps the estimate
    inside the second that the header names, so it is never further off than the header itself.

Artifacts
    The payload is its own blob, uploaded create-only (first writer wins) with its size and checksum
    as metadata *before* the record swap that references it: a record never points at a payload that
    is not fully stored. The blob's name includes the fence and a digest of the checksum, so a holder
    that lost its lease writes to a different name and cannot touch what the new holder stored; its
    upload is deleted again when its swap is refused. :meth:`read` and a hit in :meth:`acquire` fetch
    the payload; the client checks it with :meth:`~dibs.records.ArtifactRecord.verified_payload`.
    Large payloads are uploaded in parallel blocks and downloaded in parallel ranges into one growing
    buffer, never held whole twice.

Configuration (``from_url``)::

    azure://CONTAINER[/PREFIX]?account_url=https://ACCOUNT.blob.core.windows.net[&OPTIONS]

Credentials are taken from, in order: ``connection_string=`` in the URL; ``account_key=`` or
``sas_token=`` in the URL (with ``account_url=``); the ``AZURE_STORAGE_CONNECTION_STRING``
environment variable; else ``DefaultAzureCredential`` when ``azure-identity`` is installed (managed
identity, workload identity, Azure CLI login, ...). Explicit credentials in the URL win over the
environment. Percent-encode values that contain ``&``, ``+``, ``%`` or ``#`` (SAS tokens always do).
Options: ``timeout=`` (seconds per request, default 30), ``retries=`` (retries of a failed request,
default 3), ``max_concurrency=`` (parallel transfers for large artifacts, default 4). The container is
created on first write if it does not exist. Secrets never appear in :attr:`url`, logs or errors.

Waiters are woken by the process's watch hub, which follows the watched records' ETags with one
poller (:class:`_EtagFeed`): a ``HEAD`` per record for a few keys, one listing of ``records/`` for
many. Async callers run these same operations in the runtime's I/O executor; there is deliberately no
second copy written against ``azure.storage.blob.aio``.
"""

from __future__ import annotations

import base64
import binascii
import builtins
import contextlib
import dataclasses
import email.utils
import functools
import hashlib
import io
import logging
import math
import os
import random
import re
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, ClassVar, TypeVar
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from azure.core import MatchConditions
from azure.core.credentials import AzureSasCredential
from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    HttpResponseError,
    ResourceExistsError,
    ResourceNotFoundError,
)
from azure.storage.blob import BlobServiceClient, ContainerClient, ContentSettings, LinearRetry

from dibs.errors import ConfigurationError, CorruptRecord, LeaseLost, ReservationError, StoreUnavailable
from dibs.keys import Key
from dibs.records import ArtifactRecord, KeyState, LeaseToken, Present, StoreOutcome
from dibs.stores import codec, decoder, redact_url, transitions
from dibs.stores.base import Listing, Loaded, RecordStore, Skipped, skip
from dibs.stores.feeds import ChangeFeed, PollingFeed
from dibs.stores.requests import AcquireRequest, NewArtifact

__all__ = ["AzureBlobStore", "ServiceClock", "parse_url"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

CONNECTION_STRING_ENV = "AZURE_STORAGE_CONNECTION_STRING"
EXAMPLE_URL = "azure://my-container/optional/prefix?account_url=https://myaccount.blob.core.windows.net"

DEFAULT_TIMEOUT = 30.0
DEFAULT_RETRIES = 3
DEFAULT_MAX_CONCURRENCY = 4

#: A record is a few hundred bytes; anything bigger in ``records/`` is not ours and is not downloaded.
MAX_RECORD_BYTES = decoder.MAX_RECORD_BYTES
#: Reads of one record before a missing service time is an error (see AzureBlobStore._timed_read).
_READS_FOR_A_TIME = 3
#: Payloads up to this size go in one request; larger ones in parallel blocks/ranges of ``_CHUNK``.
_SINGLE_TRANSFER = 8 * 1024 * 1024
_CHUNK = 4 * 1024 * 1024

ARTIFACT_FORMAT = "dibs.artifact/1"

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


# --------------------------------------------------------------------------------------------------
# Configuration


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

    Nothing is contacted: connecting is :meth:`AzureBlobStore.from_url`'s business.
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


@dataclasses.dataclass(frozen=True)
class _Connection:
    service: BlobServiceClient
    source: str
    owned_credential: Any = None


def _endpoint_of(service: BlobServiceClient) -> str:
    """The account endpoint without query (a SAS never leaves this module in a URL)."""
    return f"{service.scheme}://{service.primary_hostname}".rstrip("/")


def _same_endpoint(a: str, b: str) -> bool:
    return a.rstrip("/").lower() == b.rstrip("/").lower()


def connect(
    settings: AzureSettings,
    environ: Mapping[str, str] | None = None,
    client_options: Mapping[str, Any] | None = None,
) -> _Connection:
    """Build the service client with the first credential found (order in the module docstring).

    ``client_options`` go to the SDK client as they are (``transport=``, ``proxies=``, ...), over
    dibs' defaults. Only constructs clients: no request is sent, so this also serves to test
    credential selection.
    """
    environ = os.environ if environ is None else environ
    options = {**_client_options(settings), **(client_options or {})}
    where = f"azure://{settings.container}"

    def from_connection_string(value: str, source: str) -> BlobServiceClient:
        try:
            service = BlobServiceClient.from_connection_string(value, **options)
        except (ValueError, TypeError) as exc:
            reason = _scrub(str(exc), (value, *settings.secrets))
            raise ConfigurationError(
                f"the connection string from {source} for {where} is not valid ({reason}); expected e.g. "
                "'DefaultEndpointsProtocol=https;AccountName=NAME;AccountKey=KEY;"
                "EndpointSuffix=core.windows.net' (its value is not shown)"
            ) from None
        endpoint = _endpoint_of(service)
        if settings.account_url is not None and not _same_endpoint(endpoint, settings.account_url):
            raise ConfigurationError(
                f"the connection string from {source} names the endpoint {endpoint!r}, but the URL's "
                f"account_url is {redact_url(settings.account_url)!r}: drop one of them"
            )
        return service

    if settings.connection_string is not None:
        return _Connection(from_connection_string(settings.connection_string, "the URL"), "connection string")
    if settings.account_url is not None and settings.account_key is not None:
        service = _service(settings, settings.account_key, options)
        return _Connection(service, "account key")
    if settings.account_url is not None and settings.sas_token is not None:
        service = _service(settings, AzureSasCredential(settings.sas_token), options)
        return _Connection(service, "SAS token")
    env_value = environ.get(CONNECTION_STRING_ENV, "").strip()
    if env_value:
        return _Connection(
            from_connection_string(env_value, f"${CONNECTION_STRING_ENV}"), f"${CONNECTION_STRING_ENV}"
        )
    if settings.account_url is None:
        raise ConfigurationError(
            f"no Azure account for {where}: add account_url= (e.g. {EXAMPLE_URL!r}) or a "
            f"connection_string=, or set ${CONNECTION_STRING_ENV}"
        )
    try:
        from azure.identity import DefaultAzureCredential
    except ImportError:
        raise ConfigurationError(
            f"no credential for {where}: give connection_string=, account_key= or sas_token= in the URL, "
            f"set ${CONNECTION_STRING_ENV}, or install azure-identity (pip install azure-identity) to "
            "use DefaultAzureCredential (managed identity, workload identity, Azure CLI login)"
        ) from None
    credential = DefaultAzureCredential()
    try:
        service = _service(settings, credential, options)
    except BaseException:
        credential.close()
        raise
    return _Connection(service, "DefaultAzureCredential", owned_credential=credential)


def _service(settings: AzureSettings, credential: Any, options: dict[str, Any]) -> BlobServiceClient:
    assert settings.account_url is not None
    try:
        return BlobServiceClient(settings.account_url, credential=credential, **options)
    except (ValueError, TypeError) as exc:
        # e.g. "Token credential is only supported with HTTPS", or no account name in the endpoint.
        raise ConfigurationError(
            f"cannot use account_url {redact_url(settings.account_url)!r} for azure://{settings.container}: "
            f"{_scrub(str(exc), settings.secrets)}"
        ) from None


class _QuickRetry(LinearRetry):
    """The SDK's retry rules (connection errors, 408, 5xx), waiting 0.25 to 0.75 s between attempts.

    A credential that cannot produce a token is not retried: that will not fix itself in a second,
    and DefaultAzureCredential walks its whole chain (with network probes) on every attempt.
    """

    def get_backoff_time(self, settings: dict[str, Any]) -> float:
        return random.uniform(0.25, 0.75)

    def increment(
        self, settings: dict[str, Any], request: Any, response: Any = None, error: AzureError | None = None
    ) -> bool:
        if isinstance(error, ClientAuthenticationError):
            return False
        return bool(super().increment(settings, request, response, error))


def _client_options(settings: AzureSettings) -> dict[str, Any]:
    # The SDK's default retry waits 15 s, 18 s, 24 s: far longer than a heartbeat interval. A store
    # makes one attempt (see dibs.stores.base); these few quick retries only ride out a dropped
    # connection, and the caller's own policy handles longer outages.
    return {
        "retry_policy": _QuickRetry(retry_total=settings.retries),
        "connection_timeout": min(settings.timeout, 10.0),
        "read_timeout": settings.timeout,
        "max_single_put_size": _SINGLE_TRANSFER,
        "max_block_size": _CHUNK,
        "max_single_get_size": _CHUNK,
        "max_chunk_get_size": _CHUNK,
    }


# --------------------------------------------------------------------------------------------------
# The service's clock


class ServiceClock:
    """The Blob service's time, from ``Date`` response headers (one-second resolution), refined.

    A response stamped ``Date: D`` was produced at some service time in ``[D, D + 1)``, and at some
    local monotonic time between sending the request (``sent``) and receiving the headers
    (``received``). So the offset ``service - monotonic`` lies in ``[D - received, D + 1 - sent)``.
    Intersecting these intervals over successive requests pins the offset down to about the
    round-trip time once a few responses have straddled a second boundary. The estimate is the
    middle of the interval, so its error is at most half a second plus half a round trip from the
    first request on (truncating ``Date`` errs by up to a whole second), and a few milliseconds
    once it has converged. It is also clamped into ``[D, D + 1)``: whatever this host's clock does,
    ``now`` is never further from the service's time than the header itself says. Only elapsed
    *monotonic* time of this process is used, never the wall clock, so clock skew between clients
    cannot matter; if the intervals stop agreeing (the service's clock stepped, this host was
    suspended), the estimate starts over from the latest header.
    """

    #: How fast the monotonic clock may drift from the service's (widens the interval over time).
    DRIFT = 1e-4

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._low = -math.inf
        self._high = math.inf
        self._at = 0.0
        self._last = -math.inf

    def observe(self, date: float, sent: float, received: float) -> float:
        """The service time at which the response stamped ``date`` (whole seconds) was produced."""
        low, high = date - received, date + 1.0 - sent
        with self._lock:
            slack = self.DRIFT * max(0.0, received - self._at)
            merged_low, merged_high = max(self._low - slack, low), min(self._high + slack, high)
            if merged_low > merged_high:
                # The service's clock stepped, another front end answered, or this host slept: start over.
                merged_low, merged_high = low, high
            self._low, self._high, self._at = merged_low, merged_high, received
            estimate = (sent + received) / 2 + (merged_low + merged_high) / 2
            # Never go backwards within one process unless the header forces it.
            estimate = max(estimate, self._last)
            now = min(max(estimate, date), math.nextafter(date + 1.0, date))
            self._last = now
            return now


class _Exchange:
    """Send time, receive time and ``Date`` header of one SDK call, taken by its per-call hooks.

    The request hook fires on the first attempt only (the SDK drops it for retries), which is what the
    clock needs: ``sent`` must be no later than the attempt whose response is used.
    """

    __slots__ = ("date", "received", "sent")

    def __init__(self) -> None:
        self.sent: float | None = None
        self.received: float | None = None
        self.date: str | None = None

    def on_request(self, request: Any) -> None:
        if self.sent is None:
            self.sent = time.monotonic()

    def on_response(self, response: Any) -> None:
        self.received = time.monotonic()
        self.date = response.http_response.headers.get("Date")


# --------------------------------------------------------------------------------------------------
# Errors


def _scrub(text: str, secrets: tuple[str, ...]) -> str:
    """``text`` without the given secret values or anything secret-looking (SAS ``sig=``, keys)."""
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= 4:
            text = text.replace(secret, "***")
            text = text.replace(quote(secret, safe=""), "***")
    text = redact_url(text)
    return re.sub(r"(AccountKey|SharedAccessSignature)=[^;\s&]*", r"\1=***", text, flags=re.IGNORECASE)


def _describe(exc: BaseException, secrets: tuple[str, ...]) -> str:
    """One line about a service error: its kind, HTTP status, service error code and first message line."""
    parts = [type(exc).__name__]
    status = getattr(exc, "status_code", None)
    if status is not None:
        parts.append(f"HTTP {status}")
    code = getattr(exc, "error_code", None)
    if code:
        parts.append(str(getattr(code, "value", code)))
    message = str(getattr(exc, "message", None) or exc).strip().splitlines()
    first = message[0][:300] if message else ""
    return _scrub(f"{' '.join(parts)}: {first}" if first else " ".join(parts), secrets)


def _is_conflict(exc: BaseException) -> bool:
    """409/412: another writer changed or created the blob first (the losing side of a swap)."""
    return isinstance(exc, HttpResponseError) and exc.status_code in (409, 412)


def _is_missing_container(exc: BaseException) -> bool:
    return (
        isinstance(exc, ResourceNotFoundError) and str(getattr(exc, "error_code", "")) == "ContainerNotFound"
    )


def _no_credential(exc: BaseException) -> bool:
    try:
        from azure.identity import CredentialUnavailableError
    except ImportError:
        return False
    return isinstance(exc, CredentialUnavailableError)


# --------------------------------------------------------------------------------------------------
# The store


class AzureBlobStore(RecordStore):
    """Reservations in an Azure Blob Storage container. See the module docstring for layout and rules."""

    scheme = "azure"
    clock = "the Blob service's clock (response Date header)"

    #: How often a read retries when a payload vanished under it (a concurrent ``forget``).
    payload_read_attempts: ClassVar[int] = 3

    def __init__(
        self,
        service: BlobServiceClient,
        container: str,
        *,
        prefix: str = "",
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        credential_source: str = "the given client",
        url_options: Mapping[str, str] | None = None,
        secrets: tuple[str, ...] = (),
        owned_credential: Any = None,
    ) -> None:
        """Use ``container`` of an existing client (``from_url`` is the usual way in).

        ``prefix`` must be empty or end with ``/``; ``secrets`` are values to keep out of error messages.
        """
        if prefix and not prefix.endswith("/"):
            raise ConfigurationError(f"prefix {prefix!r} must end with '/'")
        self._service = service
        self._container: ContainerClient = service.get_container_client(container)
        self.container = container
        self.prefix = prefix
        self.credential_source = credential_source
        self._max_concurrency = max_concurrency
        self._url_options = dict(url_options or {})
        self._secrets = secrets
        self._owned_credential = owned_credential
        self._endpoint = _endpoint_of(service)
        self._clock = ServiceClock()
        self._closed = False

    @classmethod
    def from_url(cls, url: str, **client_options: Any) -> AzureBlobStore:
        """Open the store an ``azure://`` URL names; ``client_options`` go to the SDK client as they are
        (a custom ``transport``, ``proxies``, ...). No request is sent until the first operation."""
        settings = parse_url(url)
        connection = connect(settings, client_options=client_options)
        options = {}
        if settings.timeout != DEFAULT_TIMEOUT:
            options["timeout"] = f"{settings.timeout:g}"
        if settings.retries != DEFAULT_RETRIES:
            options["retries"] = str(settings.retries)
        if settings.max_concurrency != DEFAULT_MAX_CONCURRENCY:
            options["max_concurrency"] = str(settings.max_concurrency)
        return cls(
            connection.service,
            settings.container,
            prefix=settings.prefix,
            max_concurrency=settings.max_concurrency,
            credential_source=connection.source,
            url_options=options,
            secrets=settings.secrets,
            owned_credential=connection.owned_credential,
        )

    @property
    def url(self) -> str:
        """Container, prefix, endpoint and options; never a credential (reopening needs one from the
        environment or DefaultAzureCredential)."""
        path = f"/{self.prefix.rstrip('/')}" if self.prefix else ""
        query = "&".join(
            f"{name}={value}" for name, value in {"account_url": self._endpoint, **self._url_options}.items()
        )
        return redact_url(f"azure://{self.container}{path}?{query}")  # the one way a URL is shown

    # Names --------------------------------------------------------------------------------------

    def record_name(self, key: Key) -> str:
        """The blob holding ``key``'s record (for operators inspecting the container)."""
        return f"{self.prefix}records/{key.digest}"

    def artifact_name(self, key: Key, artifact: ArtifactRecord) -> str:
        """The blob holding ``artifact``'s payload."""
        return self._artifact_name(key, artifact.fence, artifact.checksum)

    def _artifact_name(self, key: Key, fence: int, checksum: str) -> str:
        # The checksum is caller-supplied text: only a digest of it becomes part of a name.
        tag = hashlib.sha256(checksum.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        return f"{self.prefix}artifacts/{key.digest}-{fence}-{tag}"

    def _where(self, name: str) -> str:
        return f"azure://{self.container}/{name}"

    # Errors -------------------------------------------------------------------------------------

    def _error(self, exc: AzureError, action: str, key: Key | None = None) -> ReservationError:
        what = f" {key}" if key is not None else ""
        fields = {"key": str(key)} if key is not None else {}
        if _no_credential(exc):
            return ConfigurationError(
                f"no Azure credential found for {self.url} ({self.credential_source} found none): give "
                f"connection_string=, account_key= or sas_token= in the URL, set ${CONNECTION_STRING_ENV}, "
                "or sign in (managed identity, workload identity, 'az login')",
                **fields,
            )
        hint = ""
        if isinstance(exc, ClientAuthenticationError):
            hint = f"; check the {self.credential_source} and its permissions on container {self.container!r}"
        return StoreUnavailable(
            f"Azure Blob store {self.url} could not {action}{what}: {_describe(exc, self._secrets)}{hint}",
            **fields,
        )

    def _call(self, action: str, key: Key | None, fn: Callable[[], T]) -> T:
        """Run one SDK call, translating its errors (secrets scrubbed, the SDK's exception not chained,
        because its text may quote request URLs that carry a SAS)."""
        if self._closed:
            raise StoreUnavailable(f"Azure Blob store {self.url} is closed")
        try:
            return fn()
        except AzureError as exc:
            raise self._error(exc, action, key) from None

    # Reading ------------------------------------------------------------------------------------

    def _now(self, exchange: _Exchange, action: str, key: Key | str) -> float:
        parsed = None
        if exchange.date is not None:
            try:
                parsed = email.utils.parsedate_to_datetime(exchange.date).timestamp()
            except (TypeError, ValueError):
                parsed = None
        if parsed is None or exchange.received is None:
            # Never fall back to this machine's clock: that would break the Time rule silently.
            raise StoreUnavailable(
                f"Azure Blob store {self.url} answered {action} {key} without a usable Date header "
                f"({exchange.date!r}); dibs judges expiry by the service's clock and needs it",
                key=str(key),
            )
        sent = exchange.sent if exchange.sent is not None else exchange.received
        return self._clock.observe(parsed, sent, exchange.received)

    def _read_raw(self, key: Key) -> tuple[bytes | None, str | None, float]:
        """The record blob's bytes (``None`` when absent), its ETag, and the service's time of the read."""
        name = self.record_name(key)

        def download(exchange: _Exchange) -> tuple[bytes | None, str | None]:
            blob = self._container.get_blob_client(name)
            try:
                downloader = blob.download_blob(
                    raw_request_hook=exchange.on_request, raw_response_hook=exchange.on_response
                )
            except ResourceNotFoundError:  # no such blob, or no container yet: the key is free
                return None, None
            size = downloader.properties.size
            if size > MAX_RECORD_BYTES:
                why = f"it is {size} bytes, more than {MAX_RECORD_BYTES}"
                raise decoder.corrupt(key, self._where(name), why)
            return downloader.readall(), downloader.properties.etag

        (data, etag), exchange = self._timed_read("read the record of", key, download)
        return data, etag, self._now(exchange, "a read of", key)

    def _timed_read(
        self, action: str, key: Key | None, read: Callable[[_Exchange], T]
    ) -> tuple[T, _Exchange]:
        """Run ``read`` (one SDK call, hooked to ``exchange``) and return what it read with its exchange.

        When the SDK retries a request that got no response at all (a reset connection), it drops the
        per-call hooks: azure-storage-blob keeps them for a retry only once a response has arrived.
        Such a read succeeds but leaves no service time behind, so it is read again (a read is safe to
        repeat) rather than reported as a service without a Date header.
        """
        for _ in range(_READS_FOR_A_TIME):
            exchange = _Exchange()
            result = self._call(action, key, functools.partial(read, exchange))
            if exchange.received is not None:
                break
            logger.info("%s: the SDK retried a read without its hooks; reading it again", self.url)
        return result, exchange

    def _decode(self, key: Key, data: bytes | None, now: float) -> KeyState:
        if data is None:
            return transitions.empty(key, now)
        return codec.decode(data, key, now, where=self._where(self.record_name(key)))

    def _load(self, key: Key) -> tuple[KeyState, object]:
        data, etag, now = self._read_raw(key)
        return self._decode(key, data, now), etag

    # Writing ------------------------------------------------------------------------------------

    def _ensure_container(self) -> None:
        """Create the container (someone else creating it first is fine).

        A container deleted a moment ago cannot be created again for a while on Azure (409
        ``ContainerBeingDeleted``): that is reported as :class:`StoreUnavailable`, it passes.
        """

        def create() -> None:
            try:
                self._container.create_container()
            except ResourceExistsError as exc:
                if str(getattr(exc, "error_code", "")) != "ContainerAlreadyExists":
                    raise

        self._call(f"create container {self.container!r}", None, create)

    def _swap(self, key: Key, version: object, new: KeyState, old: KeyState) -> bool | Loaded:
        swapped = self._write(key, version, new)
        if swapped is True and old.artifact is not None:
            kept = new.artifact
            if kept is None or self.artifact_name(key, kept) != self.artifact_name(key, old.artifact):
                # The record no longer names this payload. Records are never deleted (removal writes
                # a tombstone that keeps the fence), so fences only grow and no later record can name
                # it again: deleting it cannot hurt anyone, however late this call runs.
                self._delete_quietly(key, self.artifact_name(key, old.artifact))
        return swapped

    def _write(self, key: Key, version: object, new: KeyState) -> bool | Loaded:
        name = self.record_name(key)
        data = codec.encode(new)
        blob = self._container.get_blob_client(name)
        if version is None:
            condition: dict[str, Any] = {"overwrite": False}  # If-None-Match: *
        else:
            condition = {"overwrite": True, "etag": version, "match_condition": MatchConditions.IfNotModified}
        metadata = {"dibs_format": codec.FORMAT, "dibs_namespace": key.namespace}

        def upload(create_container: bool = True) -> bool:
            try:
                blob.upload_blob(
                    data,
                    metadata=metadata,
                    content_settings=ContentSettings(content_type="application/json"),
                    **condition,
                )
            except ResourceNotFoundError as exc:
                if not _is_missing_container(exc):
                    raise
                if version is not None:
                    return False  # the record (and its container) went away: read again
                if not create_container:
                    raise  # created it, and it is gone again: report it rather than loop
                self._ensure_container()
                return upload(create_container=False)
            except HttpResponseError as exc:
                if _is_conflict(exc):
                    return False
                raise
            return True

        if self._call("write the record of", key, upload):
            return True
        # Someone else's write landed first, or our own did and its response was lost before the SDK
        # retried it. Reading the record now tells the two apart, and the read is handed back to
        # RecordStore._update for its next attempt, so settling this costs no extra request.
        current, etag, now = self._read_raw(key)
        if current == data:
            return True  # the record holds exactly what we meant to write
        return self._decode(key, current, now), etag

    # Artifacts ----------------------------------------------------------------------------------

    def _upload_artifact(self, key: Key, fence: int, payload: bytes, checksum: str) -> tuple[str, bool]:
        """Store the payload create-only; ``(name, True)`` if this call created the blob."""
        name = self._artifact_name(key, fence, checksum)
        metadata = {
            "dibs_format": ARTIFACT_FORMAT,
            "dibs_key": key.digest,
            "dibs_fence": str(fence),
            "dibs_size": str(len(payload)),
        }
        if checksum.isascii() and checksum.isprintable():
            metadata["dibs_checksum"] = checksum
        blob = self._container.get_blob_client(name)

        def upload(create_container: bool = True) -> bool:
            try:
                blob.upload_blob(
                    payload,
                    length=len(payload),
                    overwrite=False,  # first writer wins; a name is only ever written with one content
                    metadata=metadata,
                    max_concurrency=self._max_concurrency,
                    content_settings=ContentSettings(content_type="application/octet-stream"),
                )
            except ResourceNotFoundError as exc:
                if not _is_missing_container(exc) or not create_container:
                    raise
                self._ensure_container()
                return upload(create_container=False)
            except ResourceExistsError:
                # Same key, fence and checksum: the same holder (or its hand-off partner) already
                # stored these bytes, perhaps in an attempt whose response was lost.
                return False
            return True

        return name, self._call("store the artifact of", key, upload)

    def _fetch_payload(self, key: Key, artifact: ArtifactRecord) -> bytes | None:
        """The payload blob's bytes, or ``None`` if it does not exist."""
        blob = self._container.get_blob_client(self.artifact_name(key, artifact))

        def download() -> bytes | None:
            try:
                downloader = blob.download_blob(max_concurrency=self._max_concurrency)
            except ResourceNotFoundError:
                return None
            # BytesIO grows one buffer and getvalue() hands that buffer over without copying it.
            buffer = io.BytesIO()
            downloader.readinto(buffer)
            return buffer.getvalue()

        return self._call("read the artifact of", key, download)

    def _with_payload(
        self,
        key: Key,
        fetch_state: Callable[[], T],
        artifact_of: Callable[[T], ArtifactRecord | None],
        attach: Callable[[T, ArtifactRecord], T],
    ) -> T:
        """Run ``fetch_state`` and attach its artifact's payload; retry when the payload vanished.

        The payload blob is deleted only after ``forget`` changed the record, so a missing payload means
        either a concurrent forget (the next read no longer shows the artifact) or a lost blob (the
        record still names it: then the payload is served empty and fails its integrity check).
        """
        for _ in range(self.payload_read_attempts):
            result = fetch_state()
            artifact = artifact_of(result)
            if artifact is None:
                return result
            payload = self._fetch_payload(key, artifact)
            if payload is not None:
                return attach(result, dataclasses.replace(artifact, payload=payload))
            missing = self.artifact_name(key, artifact)
        logger.warning(
            "the artifact payload of %s is missing (%s); it will fail its integrity check: 'dibs forget' "
            "the key to recompute it",
            key,
            self._where(missing),
        )
        return result

    def read(self, key: Key) -> KeyState:
        return self._with_payload(
            key,
            lambda: self._load(key)[0],
            lambda state: state.artifact,
            lambda state, artifact: dataclasses.replace(state, artifact=artifact),
        )

    def acquire(self, key: Key, request: AcquireRequest) -> StoreOutcome:
        return self._with_payload(
            key,
            lambda: super(AzureBlobStore, self).acquire(key, request),
            lambda outcome: outcome.artifact if isinstance(outcome, Present) else None,
            lambda _outcome, artifact: Present(artifact),
        )

    def complete(self, key: Key, token: LeaseToken, artifact: NewArtifact) -> ArtifactRecord:
        # Check the token before uploading anything: a holder that lost its lease should not push a
        # large payload just to have it refused. The read is reused by the swap below.
        loaded = self._load(key)
        transitions.complete(loaded[0], token, artifact)
        name, created = self._upload_artifact(key, token.fence, artifact.payload, artifact.checksum)
        try:
            return self._update(
                key,
                lambda state: transitions.complete(state, token, artifact),
                loaded=loaded,
            )
        except LeaseLost:
            # Fenced out between the check and the swap: remove our upload, which no record names.
            if created:
                self._delete_quietly(key, name)
            raise

    def _delete_quietly(self, key: Key, name: str) -> None:
        def delete() -> None:
            with contextlib.suppress(ResourceNotFoundError):
                self._container.delete_blob(name)

        try:
            self._call("delete an unused artifact of", key, delete)
        except ReservationError as exc:
            logger.warning(
                "could not delete unused artifact blob %s (%s); it is harmless, remove it by hand",
                self._where(name),
                exc,
            )

    # Listing ------------------------------------------------------------------------------------

    def list(self, namespace: str | None = None) -> Listing:
        """Every key with a record, sorted by key, artifacts without payloads.

        Blobs in ``records/`` that are not dibs records are skipped, logged and counted (see
        :class:`~dibs.stores.base.Listing`): one foreign blob must not stop ``dibs ls`` or the
        reaper; reading that key directly raises :class:`CorruptRecord`.
        """
        prefix = f"{self.prefix}records/"

        def names() -> list[str]:
            try:
                return [
                    props.name
                    for props in self._container.list_blobs(name_starts_with=prefix, include=["metadata"])
                    if namespace is None
                    or (props.metadata or {}).get("dibs_namespace", namespace) == namespace
                ]
            except ResourceNotFoundError:
                return []

        states: builtins.list[KeyState] = []
        skipped: builtins.list[Skipped] = []
        for name in self._call("list the records in", None, names):
            try:
                state = self._list_entry(name)
            except CorruptRecord as exc:
                skip(skipped, self._where(name), exc)
                continue
            if state is not None and (namespace is None or state.key.namespace == namespace):
                states.append(state)
        return Listing(states, skipped)

    def _list_entry(self, name: str) -> KeyState | None:
        where = self._where(name)

        def download(exchange: _Exchange) -> bytes | None:
            try:
                downloader = self._container.get_blob_client(name).download_blob(
                    raw_request_hook=exchange.on_request, raw_response_hook=exchange.on_response
                )
            except ResourceNotFoundError:
                return None
            if downloader.properties.size > MAX_RECORD_BYTES:
                return b""
            return downloader.readall()

        data, exchange = self._timed_read(f"read {where}", None, download)
        if data is None:
            return None
        if not data:
            raise decoder.corrupt(None, where, f"it is more than {MAX_RECORD_BYTES} bytes")
        digest = name.removeprefix(f"{self.prefix}records/")
        return codec.decode(data, None, self._now(exchange, "a read of", where), where=where, digest=digest)

    # Lifecycle ----------------------------------------------------------------------------------

    def change_feed(self) -> ChangeFeed:
        return _EtagFeed(self)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        super().close()
        for closable in (self._container, self._service, self._owned_credential):
            if closable is not None:
                try:
                    closable.close()
                except Exception as exc:  # closing must not mask the caller's own error
                    logger.debug("error while closing %s: %s", type(closable).__name__, exc)


class _EtagFeed(PollingFeed):
    """Follows the ETags of the watched records: one ``HEAD`` per record while few keys are watched,
    else one listing of the records (a page holds 5,000): either way one poller per process."""

    min_interval = 0.05
    max_interval = 1.0
    #: Above this many watched keys one listing is cheaper than a request per record.
    LIST_ABOVE = 16

    def __init__(self, store: AzureBlobStore) -> None:
        super().__init__()
        self._store = store

    def tokens(self, keys: Iterable[Key]) -> Mapping[str, Hashable]:
        wanted = {self._store.record_name(key): key.digest for key in keys}
        container = self._store._container

        def heads() -> dict[str, Hashable]:
            found: dict[str, Hashable] = {}
            for name, digest in wanted.items():
                with contextlib.suppress(ResourceNotFoundError):
                    found[digest] = container.get_blob_client(name).get_blob_properties().etag
            return found

        def listing() -> dict[str, Hashable]:
            blobs = container.list_blobs(name_starts_with=f"{self._store.prefix}records/")
            try:
                return {wanted[blob.name]: blob.etag for blob in blobs if blob.name in wanted}
            except ResourceNotFoundError:  # no container yet: no records
                return {}

        return self._store._call(
            "follow the records in", None, listing if len(wanted) > self.LIST_ABOVE else heads
        )
