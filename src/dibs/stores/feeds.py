"""Change feeds: how a store tells its process's watch hub which keys may have changed.

A process has one watch hub per record store (:mod:`dibs.hub`: the stores wrapped around it share it),
and the hub has one feed, driven by its one thread, however many waiters the process has. Stores that
can push changes give a feed that listens (PostgreSQL ``LISTEN``, Redis pattern subscriptions); the
others give a :class:`PollingFeed`, which looks at every watched key at once with one cheap question
per look (SQLite's ``data_version`` and a versions query, ``stat`` of record files, blob ETags, a
MySQL versions query).

A feed only says *which* keys may have changed. The hub reads those keys once and hands the state
to every waiter on them, so a feed may report too much (that costs a read) but should not report
too little (that delays a waiter until its own backstop question).
"""

from __future__ import annotations

import abc
import threading
import time
from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from dibs.keys import Key

if TYPE_CHECKING:
    from dibs.records import KeyState

__all__ = ["ChangeFeed", "PollingFeed", "ReadPollingFeed", "Unheard", "check_watch_interval", "fingerprint"]

#: The shortest ``watch_interval`` a polling store takes: below it the hub's query loop would all but
#: spin (the file store's default is this).
WATCH_INTERVAL_MIN = 0.005


def check_watch_interval(seconds: float) -> float:
    """``seconds`` if it is a sensible pause between two looks of a polling hub, else a
    :class:`~dibs.errors.ConfigurationError` naming it and the allowed range.

    Longer than the waiters' own backstop (:attr:`dibs.backoff.Backoff.notify_maximum`) would make the
    hub slower than the waiters asking the store themselves: the hub would be pointless.
    """
    from dibs.backoff import Backoff
    from dibs.errors import ConfigurationError

    longest = Backoff.notify_maximum
    if not WATCH_INTERVAL_MIN <= seconds <= longest:
        raise ConfigurationError(
            f"watch_interval={seconds:g} is outside {WATCH_INTERVAL_MIN * 1e3:g} ms to {longest:g} s: "
            "shorter, the watch hub's looks would all but spin; longer, waiters would ask the store "
            f"themselves (every {longest:g} s at most) before the hub did"
        )
    return seconds


def fingerprint(state: KeyState) -> Hashable:
    """What a waiter can learn from a key's state: who holds it, whether it is done, how often it failed.

    Heartbeats and re-entries only move an expiry, which no waiter acts on before it passes, so they
    do not change the fingerprint and do not wake anybody.
    """
    lease, artifact, failure = state.lease, state.artifact, state.failure
    return (
        state.fence,
        None if lease is None else lease.token,
        None if artifact is None else (artifact.fence, artifact.checksum),
        0 if failure is None else failure.count,
    )


class Unheard(Exception):
    """A feed that could open but does not hear the store's changes (a ``LISTEN`` behind a transaction
    pooler, which hands the session that listens to other clients): raised by
    :meth:`ChangeFeed.open` after the feed failed to hear its own proof. The hub then does not count
    as following (its waiters poll), says why once, and tries again only after ``retry_after``
    seconds: a deaf topology rarely heals by itself, and every try costs a connection and a bound."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ChangeFeed(abc.ABC):
    """One store's source of change hints, used by exactly one thread (its hub's).

    The hub calls :meth:`open` once (and again after a failure), then :meth:`changes` in a loop. After
    every successful :meth:`open` the hub reads all watched keys itself, so a feed need not replay
    what happened while it was not listening.
    """

    #: Seconds of silence after which the hub gives an idle feed back (its connection, its thread).
    idle_seconds: float = 10.0

    def open(self) -> None:  # noqa: B027 - polling feeds have nothing to open
        """Start listening (a connection, a subscription); raise
        :class:`~dibs.errors.StoreUnavailable` if it cannot, :class:`Unheard` if it listens and
        cannot hear."""

    @abc.abstractmethod
    def changes(self, watched: Mapping[str, Key], timeout: float) -> Collection[str]:
        """Block for up to ``timeout`` seconds; the digests of keys that may have changed meanwhile.

        ``watched`` maps the :attr:`~dibs.keys.Key.digest` of every key a waiter of this process waits
        on to the key. A key that is new in ``watched`` must be reported at the feed's next look unless
        the feed is told about every change anyway (listening feeds are).
        """

    def read_many(self, store: object, keys: Sequence[Key]) -> list[KeyState] | None:
        """The states of ``keys`` (those with a record) as ``store.read_many`` gives them, read over
        the feed's own connection; ``None``: the hub asks ``store`` (the default, and whenever this
        read cannot be made).

        Called by the hub's thread right after :meth:`changes` reported the keys. A feed may answer
        only for the very store object that made it: a store wrapped around that one (a payload store,
        a test's proxy) reads through itself.
        """
        return None

    def wake(self) -> None:  # noqa: B027 - a listening feed hears every change anyway
        """A key was added to the watched set (called from a waiter's thread): a feed that only looks
        at the keys it was given returns from :meth:`changes` soon, so the hub gives it the new set."""

    def quicken(self) -> None:  # noqa: B027 - a listening feed hears every change at once anyway
        """A new waiter subscribed to a key already watched (called from the waiter's thread): a feed
        that looks ever less often while nothing changes starts again from its shortest interval."""

    def close(self) -> None:  # noqa: B027 - polling feeds have nothing to close
        """Stop listening; safe to call twice."""


class PollingFeed(ChangeFeed):
    """A feed that looks at all watched keys at once, by a cheap token per key.

    Subclasses give :meth:`tokens` (a value that changes whenever the key's record changes: a row
    version, an inode and mtime, an ETag) and may give :meth:`probe` (something cheaper still that says
    whether anything at all changed, such as SQLite's ``data_version``). The interval between looks
    starts at :attr:`min_interval` and grows towards :attr:`max_interval` while nothing changes, and is
    stretched with the number of keys so that one look never costs more than a small share of the time.
    """

    min_interval: float = 0.05
    max_interval: float = 0.5
    growth: float = 1.25
    #: Seconds one look at one key may cost at most per second of waiting (keeps a look's share small).
    per_key: float = 0.0

    def __init__(self) -> None:
        self._tokens: dict[str, Hashable] = {}
        self._interval = self.min_interval
        self._woken = threading.Event()

    @abc.abstractmethod
    def tokens(self, keys: Iterable[Key]) -> Mapping[str, Hashable]:
        """A change token per key, by digest (a key without a record may be left out)."""

    def probe(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds; ``False`` if surely nothing changed (no tokens are read then).

        Waits with :meth:`pause`, so that a new key cuts the wait short."""
        self.pause(timeout)
        return True

    def pause(self, seconds: float) -> None:
        """Sleep up to ``seconds``, less if :meth:`wake` is called meanwhile."""
        self._woken.wait(max(0.0, seconds))

    def wake(self) -> None:
        self._woken.set()

    def quicken(self) -> None:
        # The interval grows while nothing changes for the waiters already there; a new waiter has
        # waited for nothing yet. (Without this, a thousand waiters that take a second to subscribe
        # found the feed looking once a second: MariaDB's hand-off p50 was 362 ms on one key.)
        self._interval = self.min_interval

    def changes(self, watched: Mapping[str, Key], timeout: float) -> Collection[str]:
        deadline = time.monotonic() + timeout
        while True:
            if self._woken.is_set():  # a key was added: the hub has a newer set than ``watched``
                self._woken.clear()
                return ()
            new = [digest for digest in watched if digest not in self._tokens]
            remaining = deadline - time.monotonic()
            pause = max(self._interval, self.per_key * len(watched))
            if new:
                pause = 0.0
            elif not self.probe(min(pause, max(0.0, remaining))):
                if time.monotonic() >= deadline:
                    return ()
                continue
            current = self.tokens(watched.values())
            changed = set(new)
            changed.update(d for d in watched if d in self._tokens and self._tokens[d] != current.get(d))
            self._tokens = {digest: current.get(digest) for digest in watched}
            if changed:
                self._interval = self.min_interval
                return changed
            self._interval = min(self.max_interval, self._interval * self.growth)
            if time.monotonic() >= deadline:
                return ()


class _ReadsMany(Protocol):
    """All a :class:`ReadPollingFeed` needs of its store (any :class:`~dibs.stores.base.Store`)."""

    def read_many(self, keys: Sequence[Key]) -> list[KeyState]: ...


class ReadPollingFeed(PollingFeed):
    """The feed of a store that offers nothing cheaper: its tokens are the fingerprints of full reads."""

    min_interval = 0.05
    max_interval = 1.0

    def __init__(self, store: _ReadsMany) -> None:
        super().__init__()
        self._store = store

    def tokens(self, keys: Iterable[Key]) -> Mapping[str, Hashable]:
        return {state.key.digest: fingerprint(state) for state in self._store.read_many(list(keys))}
