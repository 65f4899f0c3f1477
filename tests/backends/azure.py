"""An isolated Azure store for a test: a fresh container in the session's Azurite, deleted afterwards."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from urllib.parse import quote

from tests import azurite
from tests.services import unavailable


def url_for(connection_string: str, container: str, prefix: str = "", **options: str) -> str:
    """An ``azure://`` URL with the connection string percent-encoded, as dibs expects it."""
    query = "&".join(
        f"{name}={quote(value, safe='')}"
        for name, value in {"connection_string": connection_string, **options}.items()
    )
    path = f"/{prefix}" if prefix else ""
    return f"azure://{container}{path}?{query}"


def fresh_container() -> str:
    return f"dibs-test-{uuid.uuid4().hex[:24]}"


def delete_container(connection_string: str, container: str) -> None:
    from azure.core.exceptions import ResourceNotFoundError
    from azure.storage.blob import BlobServiceClient

    with (
        BlobServiceClient.from_connection_string(connection_string) as service,
        suppress(ResourceNotFoundError),
    ):
        service.delete_container(container)


def emulator_connection_string() -> str:
    """The session emulator's connection string, or skip/fail the test (see tests.services)."""
    try:
        import azure.storage.blob  # noqa: F401
    except ImportError:
        unavailable("the Azure store needs azure-storage-blob: pip install 'dibs[azure]'")
    try:
        return azurite.session_azurite().connection_string
    except azurite.AzuriteUnavailable as exc:
        unavailable(f"no Azurite for the Azure store tests: {exc}")


@contextmanager
def isolated_url(tmp_path: Path) -> Iterator[str]:
    # The container does not exist yet: the store creates it on its first write, as in production.
    connection_string = emulator_connection_string()
    container = fresh_container()
    try:
        yield url_for(connection_string, container, "dibs/test")
    finally:
        delete_container(connection_string, container)
