"""The Redis store's change feed: one pattern subscription to every key's channel under the prefix.

Redis 7 checks a ``PSUBSCRIBE`` pattern *literally* against a user's channel rules: a user granted
``&dibs:*`` may subscribe to the pattern ``dibs:*`` but not to ``dibs:chan:*``, though every channel
the second matches is one the user may use. So the feed subscribes to ``{prefix}*`` (what an ACL that
scopes a user to the prefix grants, and every channel under the prefix is a dibs key's channel), and,
refused that, to ``{prefix}chan:*``; refused both, it says what to grant. See docs/deploy-redis.md.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Collection, Mapping
from contextlib import AbstractContextManager

import redis
import redis.client
import redis.exceptions

from dibs.errors import ConfigurationError
from dibs.keys import Key
from dibs.stores.feeds import ChangeFeed
from dibs.stores.redis.settings import CLIENT_DEFAULTS, SCAN_BATCH

__all__ = ["PatternFeed", "Service"]

#: ``service(action, key)``: a block in which redis-py's errors become dibs errors naming ``action``.
Service = Callable[[str, Key | None], AbstractContextManager[None]]


class PatternFeed(ChangeFeed):
    """``PSUBSCRIBE {prefix}*``: every complete, release, forget and reap under the prefix is published
    on its key's channel (``{prefix}chan:{digest}``), and this one subscription hears them all for the
    whole process.

    The prefix is restricted to characters that mean nothing to a glob, so the pattern matches only
    channels under it; a channel that is not a key's channel (another store's prefix that starts with
    this one) is ignored. The feed gets what it needs from the store (``subscriber``, which gives the
    client to listen on: on a cluster a different node each time, since every node hears every
    ``PUBLISH``; the prefix; ``service``, which turns redis-py's errors into dibs errors; the URL for
    its own errors), not the store itself.
    """

    def __init__(
        self, subscriber: Callable[[], redis.Redis], prefix: str, service: Service, url: str
    ) -> None:
        self._subscriber = subscriber
        self._service = service
        self._url = url
        self._prefix = prefix
        self._patterns = (f"{prefix}*".encode(), f"{prefix}chan:*".encode())
        self._channel = f"{prefix}chan:".encode()
        self._pubsub: redis.client.PubSub | None = None

    def open(self) -> None:
        refused: list[bytes] = []
        with self._service("follow the keys of", None):
            for pattern in self._patterns:
                pubsub: redis.client.PubSub = self._subscriber().pubsub()  # type: ignore[no-untyped-call]
                try:
                    _subscribe(pubsub, pattern)
                except redis.exceptions.NoPermissionError:
                    _close(pubsub)
                    refused.append(pattern)
                    continue
                except BaseException:
                    _close(pubsub)
                    raise
                self._pubsub = pubsub
                return
        first, second = (pattern.decode() for pattern in refused)
        raise ConfigurationError(
            f"the Redis user of {self._url} may not PSUBSCRIBE to {first!r} nor to {second!r}, so waiters "
            f"poll instead of being woken (slower hand-offs). Redis 7 compares a PSUBSCRIBE pattern "
            f"literally with the user's channel rules: grant one of them, e.g. "
            f"ACL SETUSER <user> '&{first}' (or resetchannels '&{second}')",
            url=self._url,
        )

    def changes(self, watched: Mapping[str, Key], timeout: float) -> Collection[str]:
        assert self._pubsub is not None, "open() first"
        digests: set[str] = set()
        skip = len(self._channel)
        with self._service("follow the keys of", None):
            message = self._pubsub.get_message(timeout=timeout)
            # Everything already queued is taken in the same call: a burst is one round of reads.
            while message is not None and len(digests) < SCAN_BATCH:
                if message["type"] == "pmessage" and message["channel"].startswith(self._channel):
                    digests.add(message["channel"][skip:].decode("ascii", "replace"))
                elif message["type"] == "psubscribe":
                    # redis-py subscribed again on a new connection (the old one broke, or a cluster
                    # client's map refresh marked it for reconnection): what was published meanwhile
                    # was missed, so every watched key may have changed.
                    digests.update(watched)
                message = self._pubsub.get_message(timeout=0.0)
        return digests

    def close(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            _close(pubsub)


def _subscribe(pubsub: redis.client.PubSub, pattern: bytes) -> None:
    """``PSUBSCRIBE pattern``, confirmed by the server before this returns: a change after it is never
    missed. A refusal (``NOPERM``) is raised as the server's error."""
    pubsub.psubscribe(pattern)
    deadline = time.monotonic() + float(CLIENT_DEFAULTS["socket_timeout"])
    while True:
        message = pubsub.get_message(timeout=max(0.0, deadline - time.monotonic()))
        if message is not None and message["type"] == "psubscribe":
            return
        if time.monotonic() >= deadline:
            raise redis.exceptions.TimeoutError("the server did not confirm the subscription")


def _close(pubsub: redis.client.PubSub) -> None:
    with contextlib.suppress(redis.exceptions.RedisError, OSError):
        pubsub.close()
