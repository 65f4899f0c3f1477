"""The SDK's client for :class:`~dibs.stores.azure.settings.AzureSettings`: the first credential found
(in the order :mod:`dibs.stores.azure` gives), dibs' request policy, and error text without secrets.
The record store and the payload store (:mod:`dibs.payloads.azure`) both connect through here."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import requests
from azure.core.credentials import AzureSasCredential
from azure.core.exceptions import AzureError, ClientAuthenticationError
from azure.storage.blob import BlobServiceClient, LinearRetry
from requests.adapters import DEFAULT_POOLSIZE, HTTPAdapter
from urllib3.util.retry import Retry

from dibs.backoff import Backoff
from dibs.errors import ConfigurationError
from dibs.stores import redact_url
from dibs.stores.azure.settings import CONNECTION_STRING_ENV, EXAMPLE_URL, AzureSettings

__all__ = [
    "Connection",
    "client_defaults",
    "connect",
    "describe",
    "endpoint_of",
    "no_credential",
    "pooled_session",
    "scrub",
]

#: Payloads up to this size go in one request; larger ones in parallel blocks/ranges of ``CHUNK``.
SINGLE_TRANSFER = 8 * 1024 * 1024
CHUNK = 4 * 1024 * 1024
#: The connections requests keeps per host unless told otherwise, the SDK's session included.
SDK_POOL_SIZE = DEFAULT_POOLSIZE


@dataclasses.dataclass(frozen=True)
class Connection:
    """A service client, where its credential came from, and a credential to close with it (one
    :func:`connect` made, such as ``DefaultAzureCredential``)."""

    service: BlobServiceClient
    source: str
    owned_credential: Any = None


def endpoint_of(service: BlobServiceClient) -> str:
    """The account endpoint without query (a SAS never leaves this module in a URL)."""
    return f"{service.scheme}://{service.primary_hostname}".rstrip("/")


def _same_endpoint(a: str, b: str) -> bool:
    return a.rstrip("/").lower() == b.rstrip("/").lower()


def connect(
    settings: AzureSettings,
    environ: Mapping[str, str] | None = None,
    client_options: Mapping[str, Any] | None = None,
) -> Connection:
    """Build the service client with the first credential found (order in :mod:`dibs.stores.azure`).

    ``client_options`` go to the SDK client as they are (``transport=``, ``proxies=``, ...), over
    dibs' defaults; a caller's ``transport`` or ``session`` keeps its own connection pool (see
    :func:`pooled_session`). Only constructs clients: no request is sent, so this also serves to test
    credential selection.
    """
    environ = os.environ if environ is None else environ
    given = dict(client_options or {})
    options = {**client_defaults(settings), **given}
    if given.keys() & {"transport", "session", "session_owner"}:
        if "session" not in given:  # the caller's transport, or its own session: not dibs' pool
            options.pop("session", None)
    elif "session" in options:  # as the SDK sets up the session it makes itself
        options["session"].trust_env = bool(given.get("use_env_settings", True))
    where = f"azure://{settings.container}"

    def from_connection_string(value: str, source: str) -> BlobServiceClient:
        try:
            service = BlobServiceClient.from_connection_string(value, **options)
        except (ValueError, TypeError) as exc:
            reason = scrub(str(exc), (value, *settings.secrets))
            raise ConfigurationError(
                f"the connection string from {source} for {where} is not valid ({reason}); expected e.g. "
                "'DefaultEndpointsProtocol=https;AccountName=NAME;AccountKey=KEY;"
                "EndpointSuffix=core.windows.net' (its value is not shown)"
            ) from None
        endpoint = endpoint_of(service)
        if settings.account_url is not None and not _same_endpoint(endpoint, settings.account_url):
            raise ConfigurationError(
                f"the connection string from {source} names the endpoint {endpoint!r}, but the URL's "
                f"account_url is {redact_url(settings.account_url)!r}: drop one of them"
            )
        return service

    if settings.connection_string is not None:
        return Connection(from_connection_string(settings.connection_string, "the URL"), "connection string")
    if settings.account_url is not None and settings.account_key is not None:
        service = _service(settings, settings.account_key, options)
        return Connection(service, "account key")
    if settings.account_url is not None and settings.sas_token is not None:
        service = _service(settings, AzureSasCredential(settings.sas_token), options)
        return Connection(service, "SAS token")
    env_value = environ.get(CONNECTION_STRING_ENV, "").strip()
    if env_value:
        return Connection(
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
    return Connection(service, "DefaultAzureCredential", owned_credential=credential)


def _service(settings: AzureSettings, credential: Any, options: dict[str, Any]) -> BlobServiceClient:
    assert settings.account_url is not None
    try:
        return BlobServiceClient(settings.account_url, credential=credential, **options)
    except (ValueError, TypeError) as exc:
        # e.g. "Token credential is only supported with HTTPS", or no account name in the endpoint.
        raise ConfigurationError(
            f"cannot use account_url {redact_url(settings.account_url)!r} for azure://{settings.container}: "
            f"{scrub(str(exc), settings.secrets)}"
        ) from None


#: 0.25 to 0.75 s between two attempts of the SDK, whichever attempt it is.
_QUICK = Backoff(initial=0.5, maximum=0.5, multiplier=1.0, jitter=0.5)


class _QuickRetry(LinearRetry):
    """The SDK's retry rules (connection errors, 408, 5xx), waiting 0.25 to 0.75 s between attempts.

    A credential that cannot produce a token is not retried: that will not fix itself in a second,
    and DefaultAzureCredential walks its whole chain (with network probes) on every attempt.
    """

    def get_backoff_time(self, settings: dict[str, Any]) -> float:
        return _QUICK.delay(0)

    def increment(
        self, settings: dict[str, Any], request: Any, response: Any = None, error: AzureError | None = None
    ) -> bool:
        if isinstance(error, ClientAuthenticationError):
            return False
        return bool(super().increment(settings, request, response, error))


def client_defaults(settings: AzureSettings) -> dict[str, Any]:
    """dibs' options for the SDK client of ``settings``; with a ``max_concurrency`` above requests'
    pool, a ``session`` (:func:`pooled_session`) that the client takes over and closes."""
    # The SDK's default retry waits 15 s, 18 s, 24 s: far longer than a heartbeat interval. A store
    # makes one attempt (see dibs.stores.base); these few quick retries only ride out a dropped
    # connection, and the caller's own policy handles longer outages.
    defaults: dict[str, Any] = {
        "retry_policy": _QuickRetry(retry_total=settings.retries),
        "connection_timeout": min(settings.timeout, 10.0),
        "read_timeout": settings.timeout,
        "max_single_put_size": SINGLE_TRANSFER,
        "max_block_size": CHUNK,
        "max_single_get_size": CHUNK,
        "max_chunk_get_size": CHUNK,
    }
    if settings.max_concurrency > SDK_POOL_SIZE:
        defaults["session"] = pooled_session(settings.max_concurrency + SDK_POOL_SIZE)
    return defaults


def pooled_session(size: int) -> requests.Session:
    """A requests session that keeps ``size`` connections per host, for the SDK's transport (which
    owns it, and closes it with the client).

    The SDK's own session keeps requests' 10: with ``max_concurrency`` above that, the removals and
    downloads running at once would open a new connection (a TLS handshake on Azure) for every request
    beyond the tenth, and urllib3 would discard it afterwards with a warning ("Connection pool is full,
    discarding connection"); the SDK's documentation of ``max_concurrency`` says to size the pool.
    :func:`client_defaults` asks for ``max_concurrency`` connections and requests' 10 besides, for what
    the same client carries meanwhile (the watch hub's looks, heartbeats, other threads' calls).
    Everything else is as the SDK mounts it: its adapter, retries left to its pipeline.
    """
    adapter_type: type[HTTPAdapter] = HTTPAdapter
    try:  # the SDK's adapter (larger socket blocks for payloads); private, so not relied upon
        from azure.core.pipeline.transport._bigger_block_size_http_adapters import BiggerBlockSizeHTTPAdapter

        adapter_type = BiggerBlockSizeHTTPAdapter
    except ImportError:  # pragma: no cover - an SDK that moved it: requests' own serves the same
        pass
    session = requests.Session()
    no_retries = Retry(total=False, redirect=False, raise_on_status=False)
    adapter = adapter_type(pool_maxsize=size, max_retries=no_retries)
    for scheme in ("http://", "https://"):
        session.mount(scheme, adapter)
    return session


def scrub(text: str, secrets: tuple[str, ...]) -> str:
    """``text`` without the given secret values or anything secret-looking (SAS ``sig=``, keys)."""
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= 4:
            text = text.replace(secret, "***")
            text = text.replace(quote(secret, safe=""), "***")
    text = redact_url(text)
    return re.sub(r"(AccountKey|SharedAccessSignature)=[^;\s&]*", r"\1=***", text, flags=re.IGNORECASE)


def describe(exc: BaseException, secrets: tuple[str, ...]) -> str:
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
    return scrub(f"{' '.join(parts)}: {first}" if first else " ".join(parts), secrets)


def no_credential(exc: BaseException) -> bool:
    try:
        from azure.identity import CredentialUnavailableError
    except ImportError:
        return False
    return isinstance(exc, CredentialUnavailableError)
