"""The Redis store's change feed: one pattern subscription to every key's channel under the prefix."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Collection, Mapping
from contextlib import AbstractContextManager

import redis
import redis.client
import redis.exceptions

from dibs.keys import Key
from dibs.stores.feeds import ChangeFeed
from dibs.stores.redis.settings import CLIENT_DEFAULTS, SCAN_BATCH

__all__ = ["PatternFeed", "Service"]

#: ``service(action, key)``: a block in which redis-py's errors become dibs errors naming ``action``.
Service = Callable[[str, Key | None], AbstractContextManager[None]]


class PatternFeed(ChangeFeed):
    """``PSUBSCRIBE {prefix}chan:*``: every complete, release, forget and reap under the prefix is
    published on its key's channel, and this one subscription hears them all for the whole process.

    The prefix is restricted to characters that mean nothing to a glob, so the pattern matches
    exactly this store's channels. The feed gets what it needs from the store (its client, its prefix,
    and ``service``, which turns redis-py's errors into dibs errors), not the store itself.
    """

    def __init__(self, client: redis.Redis, prefix: str, service: Service) -> None:
        self._client = client
        self._service = service
        self._pattern = f"{prefix}chan:*".encode()
        self._skip = len(f"{prefix}chan:")
        self._pubsub: redis.client.PubSub | None = None

    def open(self) -> None:
        with self._service("follow the keys of", None):
            pubsub: redis.client.PubSub = self._client.pubsub()  # type: ignore[no-untyped-call]
            try:
                pubsub.psubscribe(self._pattern)
                # The server confirms before this returns: a change after it is never missed.
                deadline = time.monotonic() + float(CLIENT_DEFAULTS["socket_timeout"])
                while True:
                    message = pubsub.get_message(timeout=max(0.0, deadline - time.monotonic()))
                    if message is not None and message["type"] == "psubscribe":
                        break
                    if time.monotonic() >= deadline:
                        raise redis.exceptions.TimeoutError("the server did not confirm the subscription")
            except BaseException:
                with contextlib.suppress(redis.exceptions.RedisError, OSError):
                    pubsub.close()
                raise
        self._pubsub = pubsub

    def changes(self, watched: Mapping[str, Key], timeout: float) -> Collection[str]:
        assert self._pubsub is not None, "open() first"
        digests: set[str] = set()
        with self._service("follow the keys of", None):
            message = self._pubsub.get_message(timeout=timeout)
            # Everything already queued is taken in the same call: a burst is one round of reads.
            while message is not None and len(digests) < SCAN_BATCH:
                if message["type"] == "pmessage":
                    digests.add(message["channel"][self._skip :].decode("ascii", "replace"))
                message = self._pubsub.get_message(timeout=0.0)
        return digests

    def close(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            with contextlib.suppress(redis.exceptions.RedisError, OSError):
                pubsub.close()
