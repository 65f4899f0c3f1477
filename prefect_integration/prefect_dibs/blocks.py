"""The ``DibsStore`` block: where dibs keeps leases and artifacts, saved once in Prefect.

A block lets a team point every flow (and every worker) at one shared store without copying URLs
and passwords into code. Credentials live in :class:`~pydantic.SecretStr` fields, so Prefect stores
them encrypted and never shows them in the UI, in ``repr`` or in logs; the URL field itself must be
free of secrets (it is shown in the UI), which the validator enforces.

Register the block type with ``prefect block register -m prefect_dibs``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Optional, Union
from urllib.parse import quote, urlsplit, urlunsplit

from prefect.blocks.core import Block
from prefect.filesystems import LocalFileSystem, RemoteFileSystem
from pydantic import ConfigDict, Field, SecretStr, field_validator, model_validator

from dibs import Reservations, Settings
from dibs.payloads import PayloadStore
from dibs.stores import redact_url
from prefect_dibs import payloads as block_payloads

if TYPE_CHECKING:
    from prefect_dibs.locking import DibsLockManager

__all__ = ["DibsStore"]


class DibsStore(Block):
    """A dibs store shared by flows: leases on cache keys and the artifacts they produce.

    Tasks decorated with :func:`prefect_dibs.reserved` and :class:`prefect_dibs.DibsLockManager` take
    their store, namespace and timings from it.

    Example:
        ```python
        from prefect_dibs import DibsStore

        DibsStore(url="postgresql+psycopg://dibs@db.internal/dibs", password="...").save("shared")

        @reserved("shared")          # the block's name
        @task
        def build_features(day: str) -> dict: ...
        ```
    """

    _block_type_name = "Dibs Store"
    _block_type_slug = "dibs-store"
    _logo_url = None
    _documentation_url = "https://github.com/dibs-dev/dibs/blob/main/docs/prefect.md"  # type: ignore[assignment]
    _description = (
        "A dibs store: leases on cache keys so identical expensive tasks compute once across flow runs, "
        "processes and machines, and the artifacts they produce."
    )

    # A URL typed with its password must not be echoed back by the validation error that refuses it.
    model_config = ConfigDict(hide_input_in_errors=True)

    url: str | None = Field(
        default=None,
        title="Store URL",
        description=(
            "Where leases and artifacts live, without secrets, e.g. 'postgresql+psycopg://dibs@db/dibs', "
            "'redis://cache:6379/0', 'sqlite:////shared/dibs.db'. Empty: the DIBS_STORE_URL environment "
            "variable of the process running the task, then an embedded SQLite file (one machine only)."
        ),
        examples=["postgresql+psycopg://dibs@db.internal/dibs"],
    )
    # Optional[...], not "SecretStr | None": early Prefect 3.4 releases find secret fields only in a
    # typing.Union, and would otherwise show these values in its API and UI.
    password: Optional[SecretStr] = Field(  # noqa: UP045
        default=None,
        description="Password inserted into the URL (PostgreSQL, MySQL, Redis); stored encrypted.",
    )
    namespace: str = Field(
        default="default",
        description="Key namespace (dotted words). Airflow and Prefect share artifacts within one namespace.",
    )
    ttl: float = Field(
        default=60.0,
        gt=0,
        title="Lease TTL (seconds)",
        description="A crashed holder's lease is taken over this long after its last heartbeat.",
    )
    heartbeat_interval: float | None = Field(
        default=None, gt=0, title="Heartbeat interval (seconds)", description="Default: a third of the TTL."
    )
    max_lease_age: float | None = Field(
        default=None,
        gt=0,
        title="Maximum lease age (seconds)",
        description="If set, no lease lives longer than this, however often it heartbeats.",
    )
    max_age: float | None = Field(
        default=None,
        gt=0,
        title="Result maximum age (seconds)",
        description="A stored result this old is computed again by the next call. Empty: never.",
    )
    wait_timeout: float | None = Field(
        default=None,
        ge=0,
        title="Wait timeout (seconds)",
        description="How long a reserved task waits for another holder before failing. Empty: forever.",
    )
    serializer: Literal["json", "bytes", "pickle"] = Field(
        default="json",
        description="Artifact format. 'pickle' needs a signing key, so readers never run forged data.",
    )
    signing_key: Optional[SecretStr] = Field(  # noqa: UP045 (see password)
        default=None, description="HMAC key for the 'pickle' serializer; stored encrypted."
    )
    max_failures: int | None = Field(
        default=None,
        ge=1,
        description="Refuse a key after this many recorded failures (until 'dibs forget'). Empty: never.",
    )
    on_store_unavailable: Literal["fail", "run"] = Field(
        default="fail",
        description="When the store cannot be reached: 'fail' the task, or 'run' it unreserved (logged).",
    )

    payloads_url: str | None = Field(
        default=None,
        title="Payload store URL",
        description=(
            "Where results over 64 KiB go, apart from the store's records, without secrets, e.g. "
            "'file:///shared/dibs' or 'azure://container/prefix?account_url=https://ACCOUNT.blob.core."
            "windows.net' (credentials from the environment). Empty: DIBS_PAYLOADS_URL, else results "
            "stay in the records."
        ),
        examples=["file:///shared/dibs"],
    )
    # Optional[Union[...]] for the reason given at ``password``; a nested block, saved by reference.
    payloads: Optional[Union[LocalFileSystem, RemoteFileSystem]] = Field(  # noqa: UP007, UP045
        default=None,
        title="Payload storage block",
        description=(
            "A Prefect filesystem block (Local File System or Remote File System) for results over "
            "64 KiB, instead of payloads_url: they are written through the block's own file system and "
            "credentials, under its base path (see docs/prefect.md)."
        ),
    )

    @field_validator("payloads", mode="before")
    @classmethod
    def _payloads_block_supported(cls, block: Any) -> Any:
        if isinstance(block, Block) and not block_payloads.is_supported(block):
            raise ValueError(block_payloads.refusal(block))
        return block

    @field_validator("payloads_url")
    @classmethod
    def _payloads_url_without_secrets(cls, url: str | None) -> str | None:
        return _plain_url(
            url,
            "payload store",
            "file:///shared/dibs",
            ", which this plain field would show; let the process find its credential (e.g. "
            "AZURE_STORAGE_CONNECTION_STRING)",
        )

    @field_validator("url")
    @classmethod
    def _url_without_secrets(cls, url: str | None) -> str | None:
        return _plain_url(
            url,
            "store",
            "sqlite:////abs/path/dibs.db",
            "; put the password in the 'password' field (stored encrypted) and leave it out of the URL "
            "(an '@' in an option value must be written %40)",
        )

    @model_validator(mode="after")
    def _one_payload_store(self) -> DibsStore:
        if self.payloads is not None and self.payloads_url is not None:
            raise ValueError("set payloads_url or a payloads block, not both: they name the payload store")
        return self

    @model_validator(mode="after")
    def _pickle_needs_a_key(self) -> DibsStore:
        if self.serializer == "pickle" and self.signing_key is None:
            raise ValueError(
                "serializer 'pickle' needs a signing_key, so that nobody can make readers run code"
            )
        return self

    def store_url(self) -> str | None:
        """The URL with the password inserted. It is a secret: never log it (log :attr:`url`)."""
        if self.url is None or self.password is None:
            return self.url
        parts = urlsplit(self.url)
        netloc = parts.netloc
        userinfo, _, hostport = netloc.rpartition("@")
        user = userinfo.split(":", 1)[0] if userinfo else ""
        secret = quote(self.password.get_secret_value(), safe="")
        return urlunsplit(parts._replace(netloc=f"{user}:{secret}@{hostport}"))

    def payload_store(self) -> PayloadStore | str | None:
        """The payload store: the ``payloads`` block's (one per process), else ``payloads_url``."""
        if self.payloads is not None:
            return block_payloads.payload_store(self.payloads)
        return self.payloads_url

    def settings(self, **overrides: Any) -> Settings:
        """The :class:`dibs.Settings` this block describes (signing key included), checked by the core's
        rules; ``overrides`` replace fields for one use, e.g. ``ttl=10``."""
        return Settings(
            namespace=self.namespace,
            ttl=self.ttl,
            heartbeat_interval=self.heartbeat_interval,
            max_lease_age=self.max_lease_age,
            max_age=self.max_age,
            max_failures=self.max_failures,
            on_store_unavailable=self.on_store_unavailable,
            serializer=self.serializer,
            signing_key=None if self.signing_key is None else self.signing_key.get_secret_value(),
        ).replace(**overrides)

    def get_client(self, **overrides: Any) -> Reservations:
        """A :class:`dibs.Reservations` client on this store (cheap: every client of a process shares
        the store; close it when done). ``overrides`` replace the block's settings, e.g. ``ttl=10``."""
        return Reservations(
            self.store_url(), settings=self.settings(**overrides), payloads=self.payload_store()
        )

    def lock_manager(self, **overrides: Any) -> DibsLockManager:
        """A :class:`~prefect_dibs.DibsLockManager` on this store, for Prefect's SERIALIZABLE caching."""
        from prefect_dibs.locking import DibsLockManager

        return DibsLockManager(self, **overrides)


def _plain_url(url: str | None, what: str, example: str, instead: str) -> str | None:
    """A URL typed into a plain field, stripped (``None`` if blank). The field is shown in the UI and in
    logs, so a URL holding a secret is refused, ``instead`` saying where the secret goes."""
    if url is None or not url.strip():
        return None
    url = url.strip()
    if "://" not in url:
        raise ValueError(f"{redact_url(url)!r} is not a {what} URL; expected e.g. {example!r}")
    if redact_url(url) != url:
        # redact_url hides whatever may be a password, however it is written ('?', '#', '/' or '@'
        # inside it included): anything it would hide must not be stored in a plain field.
        raise ValueError(f"the {what} URL contains a secret{instead}: {redact_url(url)}")
    return url
