"""The Azure Blob store's change feed: the watched records' ETags, polled by one poller per process."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Protocol, TypeVar

from azure.core.exceptions import ResourceNotFoundError
from azure.storage.blob import ContainerClient

from dibs.keys import Key
from dibs.stores.feeds import PollingFeed

__all__ = ["Call", "EtagFeed"]

T = TypeVar("T")


class Call(Protocol):
    """``call(action, key, fn)``: run one SDK call, its errors turned into dibs errors naming ``action``."""

    def __call__(self, action: str, key: Key | None, fn: Callable[[], T], /) -> T: ...


class EtagFeed(PollingFeed):
    """Follows the ETags of the watched records: one ``HEAD`` per record while few keys are watched,
    else one listing of the records (a page holds 5,000): either way one poller per process.

    It gets what it needs from the store (the container, how a key's record blob is named, the prefix,
    and ``call``, which runs an SDK call and translates its errors), not the store itself.
    """

    min_interval = 0.05
    max_interval = 1.0
    #: Above this many watched keys one listing is cheaper than a request per record.
    LIST_ABOVE = 16

    def __init__(
        self, container: ContainerClient, record_name: Callable[[Key], str], prefix: str, call: Call
    ) -> None:
        super().__init__()
        self._container = container
        self._record_name = record_name
        self._prefix = prefix
        self._call = call

    def tokens(self, keys: Iterable[Key]) -> Mapping[str, Hashable]:
        wanted = {self._record_name(key): key.digest for key in keys}
        container = self._container

        def heads() -> dict[str, Hashable]:
            found: dict[str, Hashable] = {}
            for name, digest in wanted.items():
                with contextlib.suppress(ResourceNotFoundError):
                    found[digest] = container.get_blob_client(name).get_blob_properties().etag
            return found

        def listing() -> dict[str, Hashable]:
            blobs = container.list_blobs(name_starts_with=f"{self._prefix}records/")
            try:
                return {wanted[blob.name]: blob.etag for blob in blobs if blob.name in wanted}
            except ResourceNotFoundError:  # no container yet: no records
                return {}

        return self._call("follow the records in", None, listing if len(wanted) > self.LIST_ABOVE else heads)
