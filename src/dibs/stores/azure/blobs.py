"""Blob helpers both Azure stores use: the record store (its records and artifact payloads) and the
payload store (:mod:`dibs.payloads.azure`). Each is one or two SDK calls and lets the SDK's errors
through: the caller translates them, in its own words, at one boundary."""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping
from typing import TypeVar

from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceNotFoundError
from azure.storage.blob import BlobClient, ContainerClient, ContentSettings

__all__ = [
    "create_container",
    "is_conflict",
    "is_missing_container",
    "put_new",
    "read_whole",
    "with_container",
]

T = TypeVar("T")


def is_conflict(exc: BaseException) -> bool:
    """409/412: another writer changed or created the blob first (the losing side of a swap)."""
    return isinstance(exc, HttpResponseError) and exc.status_code in (409, 412)


def is_missing_container(exc: BaseException) -> bool:
    return (
        isinstance(exc, ResourceNotFoundError) and str(getattr(exc, "error_code", "")) == "ContainerNotFound"
    )


def create_container(container: ContainerClient) -> bool:
    """Create the container (someone else creating it first is fine); whether this call created it.

    A container deleted a moment ago cannot be created again for a while on Azure (409
    ``ContainerBeingDeleted``): that error is raised, it passes.
    """
    try:
        container.create_container()
    except ResourceExistsError as exc:
        if str(getattr(exc, "error_code", "")) != "ContainerAlreadyExists":
            raise
        return False
    return True


def with_container(write: Callable[[], T], create: Callable[[], object]) -> T:
    """Run ``write``; when the container does not exist yet, ``create`` it and run ``write`` once more
    (a container is created on the first write). Missing again after that, it is reported rather than
    created in a loop."""
    try:
        return write()
    except ResourceNotFoundError as exc:
        if not is_missing_container(exc):
            raise
    create()
    return write()


def put_new(blob: BlobClient, data: bytes, metadata: Mapping[str, str], *, max_concurrency: int) -> bool:
    """Upload ``data`` create-only (first writer wins: a name is only ever written with one content),
    in parallel blocks when it is large; ``False`` when the blob was there already."""
    try:
        blob.upload_blob(
            data,
            length=len(data),
            overwrite=False,
            metadata=dict(metadata),
            max_concurrency=max_concurrency,
            content_settings=ContentSettings(content_type="application/octet-stream"),
        )
    except ResourceExistsError:
        return False
    return True


def read_whole(blob: BlobClient, *, max_concurrency: int) -> bytes | None:
    """The blob's bytes, downloaded in parallel ranges when it is large; ``None`` if it does not exist."""
    try:
        downloader = blob.download_blob(max_concurrency=max_concurrency)
    except ResourceNotFoundError:
        return None
    # BytesIO grows one buffer and getvalue() hands that buffer over without copying it.
    buffer = io.BytesIO()
    downloader.readinto(buffer)
    return buffer.getvalue()
