"""The Redis store: each operation runs one of the package's Lua scripts (:mod:`.scripts`), so Redis
itself decides each step atomically, on its own clock. See the package docstring for the layout."""

from __future__ import annotations

import builtins
import contextlib
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from typing import cast

import redis
import redis.exceptions
from redis.exceptions import RedisClusterException

from dibs.display import printable
from dibs.errors import ConfigurationError, CorruptRecord, ReservationError, StoreUnavailable
from dibs.keys import Key
from dibs.records import (
    ArtifactRecord,
    Granted,
    Held,
    KeyState,
    LeaseRecord,
    LeaseToken,
    Present,
    StoreOutcome,
    new_lease_id,
)
from dibs.stores import decoder, pages, redact_url, transitions
from dibs.stores.base import (
    PROGRESS_EVERY,
    Listing,
    Progress,
    Skipped,
    Store,
    reap_each,
    refuse_too_large,
    skip,
)
from dibs.stores.feeds import ChangeFeed
from dibs.stores.large import READ_INLINE, LargeReads, advise_payload_store, read_settled
from dibs.stores.redis.admin import IndexedReads
from dibs.stores.redis.feed import PatternFeed
from dibs.stores.redis.index import Indexes
from dibs.stores.redis.replicas import ReplicaWait, Unreplicated
from dibs.stores.redis.scripts import (
    COMPLETED_FIELDS,
    FIELDS,
    FORMAT,
    GRANTED_FIELDS,
    PRESENT_FIELDS,
    Reply,
    Script,
    Scripts,
)
from dibs.stores.redis.settings import SCAN_BATCH, parse_url
from dibs.stores.redis.topology import Demoted, NotStandalone, UnknownService, reach
from dibs.stores.requests import AcquireRequest, NewArtifact
from dibs.stores.transitions import MAX_ERROR_LENGTH, explain_lost

__all__ = ["DEFAULT_VALUE_LIMIT", "RedisStore"]

logger = logging.getLogger(__name__)

#: Redis's default ``proto-max-bulk-len``: the limit assumed when the server refuses ``CONFIG GET``.
DEFAULT_VALUE_LIMIT = 512 * 1024 * 1024
#: Room in the command for what ``complete`` sends besides the payload (the key, token, checksum...).
_COMMAND_OVERHEAD = 4096
#: The length of a grant's short reply when the record holds no failure (then none follows the lease's).
_GRANTED_ALONE = 3 + len(GRANTED_FIELDS)
#: The longest payload a read or a hit carries in its reply; a longer one is read apart (``_large``).
_INLINE = str(READ_INLINE)


def _seconds(value: float, what: str) -> str:
    """A finite number of seconds as the text Lua's ``tonumber`` reads back to the same double."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigurationError(
            f"{what} must be a finite number of seconds, got {value!r}", value=repr(value)
        )
    return repr(float(value))


#: What redis-py raises: its errors, and its cluster client's own (not a ``RedisError``).
_REDIS_ERRORS = (redis.exceptions.RedisError, RedisClusterException)


def _WROTE_A_LEASE(reply: Reply) -> bool:
    """An acquire's reply that the replicas must confirm: a lease granted, or re-entered."""
    return bool(reply[0] in (b"granted", b"reentered"))


def _STORED(reply: Reply) -> bool:
    return bool(reply[0] == b"ok")


def _may_repeat(exc: Exception, safe: bool) -> bool:
    """Whether a script that failed with ``exc`` may be sent once more (see :meth:`RedisStore._run`)."""
    if isinstance(exc, Demoted | redis.exceptions.ClusterDownError):
        return True  # refused before it ran: a master turned replica, a cluster re-reading its map
    if isinstance(exc, NotStandalone | UnknownService | redis.exceptions.AuthenticationError):
        return False
    # Not a timeout, nor a pool that stayed busy: each already took the whole bound once.
    return (
        safe and isinstance(exc, redis.exceptions.ConnectionError) and str(exc) != "No connection available."
    )


def _limit(node: redis.Redis) -> int:
    """The most bytes one value may have on ``node``: ``proto-max-bulk-len`` and
    ``client-query-buffer-limit`` (less room for the command's other values), or Redis's default
    where ``CONFIG`` is refused (managed services, ACLs)."""
    limits = []
    for setting, room in (("proto-max-bulk-len", 0), ("client-query-buffer-limit", _COMMAND_OVERHEAD)):
        try:
            found = node.config_get(setting).get(setting)
        except redis.exceptions.ResponseError:
            found = None
        limits.append(int(found) - room if found is not None else DEFAULT_VALUE_LIMIT)
    return min(limits)


class RedisStore(Store):
    """Reservation records in Redis, each operation one atomic Lua script judged on Redis's clock.

    See the package docstring (:mod:`dibs.stores.redis`) for the URL, the layout and Redis's limits.
    """

    scheme = "redis"
    clock = "the Redis server's clock (TIME)"

    def __init__(self, url: str) -> None:
        self._url = redact_url(url)
        self.settings = parse_url(url, self._url)
        self._prefix, self.max_artifact_size = self.settings.prefix, self.settings.max_size
        #: What every record key and every channel starts with (then the key's digest).
        self._record_start, self._channel_start = f"{self._prefix}rec:", f"{self._prefix}chan:"
        self._value_limit: int | None = None  # read from the server on the first complete
        try:
            self._reach = reach(self.settings)
        except (ValueError, TypeError) as exc:
            raise self.settings.bad(
                f"{exc} (redis-py's connection options, such as socket_timeout, max_connections or "
                "ssl_cert_reqs, go as further query parameters)"
            ) from exc
        scripts = Scripts.load()
        self._acquire, self._heartbeat, self._complete = scripts.acquire, scripts.heartbeat, scripts.complete
        self._release, self._drop, self._read = scripts.release, scripts.drop, scripts.read
        self._reindex, self._drop_many = scripts.reindex, scripts.drop_many
        #: The namespaces' indexes the writing scripts keep (:mod:`.index`), and the reads through them.
        self._indexes = Indexes(self._prefix, self.settings.topology)
        #: Without indexes (a cluster under an untagged prefix) the admin reads are scans: ``top`` then
        #: lists once per refresh (:meth:`~dibs.stores.base.Store.overview`).
        self.scans = not self._indexes.enabled
        self._admin = IndexedReads(self)
        self._index_ready = False  # the marker was seen (or set by this store's backfill)
        self._told_unindexed = False
        self._replicas = (
            ReplicaWait(self.settings.min_replicas, self.settings.replica_timeout, self._reach)
            if self.settings.min_replicas
            else None
        )
        #: min_replicas: the keys whose complete this store could not confirm, by digest, with the
        #: artifact's fence: a read of such a key confirms the artifact before it reports it.
        self._unconfirmed: dict[str, int] = {}
        #: Large artifacts read apart from their records, once for the threads that want one at a time.
        self._large = LargeReads(self._read_large)

    @classmethod
    def from_url(cls, url: str) -> RedisStore:
        return cls(url)

    @property
    def url(self) -> str:
        return self._url

    @property
    def prefix(self) -> str:
        """What every Redis key of this store starts with."""
        return self._prefix

    def record_key(self, key: Key) -> str:
        """The Redis key of ``key``'s record hash (for operators and tests)."""
        return f"{self._record_start}{key.digest}"

    def channel(self, key: Key) -> str:
        """The pub/sub channel on which changes to ``key`` that can end a wait are published."""
        return f"{self._channel_start}{key.digest}"

    # -- operations ---------------------------------------------------------------------------------

    def read(self, key: Key) -> KeyState:
        def once() -> KeyState | None:
            reply = self._run(self._read, key, "read", key.namespace, key.name, "1", _INLINE, safe=True)
            return self._with_payload(self._state(key, reply, with_payload=True))

        state = read_settled(key, once)
        if self._unconfirmed and key.digest in self._unconfirmed:
            self._confirm(key, state)
        return state

    # -- large artifacts, read apart from their records (dibs.stores.large) ---------------------------
    def _with_payload(self, state: KeyState) -> KeyState | None:
        """``state`` with its artifact's bytes, which the read's reply leaves out when they are more
        than :data:`~dibs.stores.large.READ_INLINE`; ``None`` when the record holds another artifact
        by now (the caller reads the key again)."""
        return self._large.state(state)

    def _read_large(self, key: Key, artifact: ArtifactRecord) -> bytes | None:
        """A large artifact's bytes (:class:`~dibs.stores.large.LargeReads` shares the read with the
        threads of the process that want them at the same time: a waiter's own ask, which Redis may
        run right after the holder's complete, as the hub reads): one reply of the whole value (with
        hiredis, redis-py holds it twice while it parses it, then once), not two at once. ``None`` if
        the record holds another artifact by now."""
        reply = self._run(self._read, key, "read", key.namespace, key.name, "1", safe=True)
        # hiredis keeps the buffer a reply was parsed from until the connection's next reply: a
        # PING on it (the pool hands out the connection just given back) frees the value's size.
        with contextlib.suppress(*_REDIS_ERRORS):
            self._reach.node_of(self.record_key(key)).ping()
        found = self._state(key, reply, with_payload=True).artifact
        if found is None or (found.fence, found.checksum) != (artifact.fence, artifact.checksum):
            return None
        return found.payload

    def _confirm(self, key: Key, state: KeyState) -> None:
        """Confirm, before it is reported, an artifact this store stored but could not confirm.

        A holder whose complete was not confirmed (or whose reply was lost) reads the key to settle it
        (:meth:`Lease._settle_complete <dibs.lease.Lease._settle_complete>`): finding its artifact on
        the master, it keeps it as stored. That is true only once the replicas have it: on a master
        about to be demoted (a split brain) the artifact is lost with the master's writes, and the key
        would be computed again. So the read asks the replicas first (a ``PUBLISH`` on the key's
        channel, which the replicas receive after the artifact, then ``WAIT``); until they confirm,
        the read is :class:`StoreUnavailable` and the holder reads again. A master that is a replica
        by now drops its connections: the next read finds the new master, without the artifact, and
        the holder stores it again there.
        """
        assert self._replicas is not None
        fence = self._unconfirmed.get(key.digest)
        if fence is None or state.artifact is None or state.artifact.fence != fence:
            self._unconfirmed.pop(key.digest, None)  # replaced, or lost: the state says what is true
            return
        try:
            acknowledged = self._replicas.confirm(self.record_key(key), self.channel(key))
        except redis.exceptions.ResponseError as exc:
            # "WAIT cannot be used with replica instances": the master was demoted under us.
            self._reach.refresh()
            raise self._failure(exc, "confirm the artifact of", key) from exc
        except _REDIS_ERRORS as exc:
            raise self._failure(exc, "confirm the artifact of", key) from exc
        if acknowledged < self._replicas.replicas:
            raise StoreUnavailable(
                f"could not confirm the artifact of {key}: only {acknowledged} of the "
                f"{self._replicas.replicas} replica(s) asked for (min_replicas) have it yet",
                url=self._url,
                key=str(key),
            )
        self._unconfirmed.pop(key.digest, None)

    def acquire(self, key: Key, request: AcquireRequest) -> StoreOutcome:
        ttl, lease_id = _seconds(request.ttl, "ttl"), new_lease_id()
        try:
            reply = self._run(
                self._acquire,
                key,
                "reserve",
                key.namespace,
                key.name,
                request.owner,
                ttl,
                "" if request.max_lease_age is None else _seconds(request.max_lease_age, "max_lease_age"),
                lease_id,
                "" if request.max_age is None else _seconds(request.max_age, "max_age"),
                "" if request.min_fence is None else str(int(request.min_fence)),
                _INLINE,
                # A repeat after a lost reply is safe: the same owner re-enters the lease it was granted.
                safe=True,
                confirm=_WROTE_A_LEASE,
            )
        except Unreplicated as exc:
            raise self._unreplicated_grant(key, lease_id, exc) from None
        status = reply[0]
        if status == b"exhausted":
            raise transitions.fence_exhausted(key, int(reply[1]))
        if status == b"granted" and len(reply) == _GRANTED_ALONE:
            # The short reply, no failure recorded: the lease is what was sent and the few values only
            # the script knew, checked as the decoder checks them (decoding every field back, those
            # sent included, cost ~8 µs of each grant: issue 20).
            lease = decoder.granted_lease(
                key,
                request.owner,
                lease_id,
                float(ttl),
                {
                    "fence": reply[3],
                    "attempts": reply[4],
                    "lease_acquired_at": reply[1],
                    "lease_expires_at": reply[5],
                    "lease_max_expires_at": reply[6],
                },
                where=lambda: self._where(self.record_key(key)),
                textual=True,
            )
            took_over_from = None if reply[2] is None else str(reply[2].decode("utf-8"))
            return Granted(lease, None, took_over_from)
        if status == b"present":
            # The short reply: the artifact and the counters; the key and format are the ones sent
            # (checked by the script), and no lease or failure is reported with a hit.
            fields = dict.fromkeys(FIELDS)
            fields.update(zip(PRESENT_FIELDS, reply[3 : 3 + len(PRESENT_FIELDS)], strict=True))
            fields.update(format=FORMAT, namespace=key.namespace, name=key.name)
            state = self._decode(key, fields, float(reply[1]), payload=reply[3 + len(PRESENT_FIELDS)])
            assert state.artifact is not None
            artifact = self._large.artifact(key, state.artifact)  # left out of the reply if large
            if artifact is None:  # replaced meanwhile: ask again
                return self.acquire(key, request)
            return Present(artifact)
        if status == b"granted":
            # The short reply with the failure the record holds: the rest of the new lease is what
            # was sent (the record's key and format were checked by the script before it wrote).
            # Any stale artifact beside the lease is left out: the returned state carries none (a
            # grant does not report it, and nothing reads it).
            fields = dict.fromkeys(FIELDS)
            fields.update(zip((*GRANTED_FIELDS, *decoder.FAILURE_FIELDS), reply[3:], strict=True))
            fields.update(
                format=FORMAT,
                namespace=key.namespace,
                name=key.name,
                lease_owner=request.owner,
                lease_fence=fields["fence"],
                lease_id=lease_id,
                lease_acquired_at=reply[1],
                lease_ttl=ttl,
                lease_attempt=fields["attempts"],
            )
            state = self._decode(key, fields, float(reply[1]))
        else:
            state = self._state(key, reply)
        assert state.lease is not None
        if status == b"held":
            return Held(state.lease, state.now, state.failure)
        took_over_from = None if reply[2] is None else str(reply[2].decode("utf-8"))
        return Granted(state.lease, state.failure, took_over_from, reentered=status == b"reentered")

    def heartbeat(self, key: Key, token: LeaseToken, ttl: float) -> LeaseRecord:
        reply = self._run(
            self._heartbeat,
            key,
            "heartbeat",
            key.namespace,
            key.name,
            token.fence,
            token.lease_id,
            _seconds(ttl, "ttl"),
            safe=True,  # twice only extends the expiry twice
        )
        state = self._state(key, reply)
        if reply[0] == b"lost":
            raise explain_lost(state, token, "heartbeat")
        assert state.lease is not None
        return state.lease

    def value_limit(self) -> int:
        """The most bytes one artifact may have here: the server's limits on one value and on one
        command (read once), or ``max_artifact_size`` when that is lower.

        On a cluster, the lowest of the primaries that answer (each may have its own settings; one that
        is down does not stop a complete on the others)."""
        if self._value_limit is None:
            limits = []
            with self._service("read the server's limits", None):
                nodes = self._reach.primaries()
            failure: Exception | None = None
            for node in nodes:
                try:
                    limits.append(_limit(node))
                except _REDIS_ERRORS as exc:
                    failure = exc
            if not limits:
                assert failure is not None
                raise self._failure(failure, "read the server's limits", None) from failure
            self._value_limit = min(limits)
        if self.max_artifact_size is not None:
            return min(self._value_limit, self.max_artifact_size)
        return self._value_limit

    def complete(self, key: Key, token: LeaseToken, artifact: NewArtifact) -> ArtifactRecord:
        payload = artifact.payload
        advise_payload_store(self._url, len(payload))
        refuse_too_large(
            key,
            len(payload),
            len(payload),
            self.value_limit(),
            where=f"Redis at {self._url} takes in one value (proto-max-bulk-len, client-query-buffer-limit"
            " or ?max_artifact_size=)",
            remedy="Raise the server's limits, or store the data elsewhere and return a reference to it",
        )
        try:
            reply = self._run(
                self._complete,
                key,
                "complete",
                key.namespace,
                key.name,
                token.fence,
                token.lease_id,
                artifact.serializer,
                payload,
                artifact.checksum,
                self.channel(key),
                "" if artifact.compute_seconds is None else repr(float(artifact.compute_seconds)),
                confirm=_STORED,
            )
        except Unreplicated as exc:
            # Stored on the master, but not (yet) on enough replicas: not reported as stored. The caller
            # settles it by reading the key, and the read confirms the artifact first (_confirm).
            self._unconfirmed[key.digest] = token.fence
            raise StoreUnavailable(
                f"could not confirm the artifact of {key}: it is stored on the master of {self._url}, but "
                f"only {exc.acknowledged} of the {self.settings.min_replicas} replica(s) asked for "
                f"(min_replicas) confirmed it within {self.settings.replica_timeout:g} s, and a failover "
                "before they do would lose it",
                url=self._url,
                key=str(key),
            ) from None
        if reply[0] == b"lost":
            raise explain_lost(self._state(key, reply), token, "complete")
        # The short reply: the rest of the stored artifact is what was sent (the script wrote the
        # producer and fence of the current lease, checked to be this token's). Only what the script
        # alone knew is read from it, checked as the decoder checks it (issue 20).
        producer, created_at, compute_seconds = decoder.stored_facts(
            key,
            dict(zip(COMPLETED_FIELDS, reply[3:], strict=True), artifact_created_at=reply[1]),
            where=lambda: self._where(self.record_key(key)),
            textual=True,
        )
        return ArtifactRecord(
            serializer=artifact.serializer,
            payload=payload,
            size=len(payload),
            checksum=artifact.checksum,
            producer=producer,
            fence=token.fence,
            created_at=created_at,
            compute_seconds=compute_seconds,
        )

    def release(self, key: Key, token: LeaseToken, error: str | None = None, *, counted: bool = True) -> None:
        reply = self._run(
            self._release,
            key,
            "release",
            key.namespace,
            key.name,
            token.fence,
            token.lease_id,
            "0" if error is None else ("1" if counted else "2"),
            "" if error is None else error[:MAX_ERROR_LENGTH],
            self.channel(key),
        )
        if reply[0] == b"lost":
            raise explain_lost(self._state(key, reply), token, "release")

    def _unreplicated_grant(self, key: Key, lease_id: str, exc: Unreplicated) -> StoreUnavailable:
        """The error for a lease the replicas did not confirm in time, released first if it is new.

        Its token must not be used: a failover before the replicas have the grant would grant the same
        fence again. A new lease is released at once (best effort: a release lost too leaves a lease
        nobody holds, which expires), so waiters need not wait out its ttl; a re-entered one is the
        owner's own lease, which may be in use elsewhere (a hand-off), so it is left as it is.
        """
        reply, settings = exc.reply, self.settings
        released = ""
        if reply[0] == b"granted":
            try:
                self.release(key, LeaseToken(int(reply[3]), lease_id))
                released = "; the lease was released"
            except ReservationError as failure:
                logger.warning("could not release the unconfirmed lease of %s: %s", key, failure)
                released = "; the lease could not be released, and expires with its ttl"
        return StoreUnavailable(
            f"could not reserve {key}: Redis at {self._url} granted it, but only {exc.acknowledged} of the "
            f"{settings.min_replicas} replica(s) asked for (min_replicas) confirmed it within "
            f"{settings.replica_timeout:g} s, so a failover could grant its token again{released}",
            url=self._url,
            key=str(key),
        )

    def force_release(self, key: Key) -> bool:
        return self._drop_part(key, "lease", "force-release")

    def forget(self, key: Key) -> bool:
        return self._drop_part(key, "result", "forget")

    def list(self, namespace: str | None = None) -> Listing:
        """Every record under the prefix (in ``namespace`` when given), sorted by key, without payloads.

        Of one namespace, from its index (:mod:`.index`): what it names is read with pipelined read
        scripts, and judged on the records. Of every namespace (or without indexes: a cluster whose
        prefix has no hash tag), one SCAN over ``{prefix}rec:*`` on every node that holds keys (each
        primary of a cluster) plus one pipelined read script per record on the same node. A value
        under the prefix that is not a dibs record is skipped, logged and counted (see
        :class:`~dibs.stores.base.Listing`).
        """
        if namespace is not None and self._indexed():
            with self._service("list keys", None):
                states, skipped = self._admin.list(namespace)
            return Listing(states, skipped)
        return self._scanned(namespace)

    def _scanned(self, namespace: str | None) -> Listing:
        """:meth:`list` by a SCAN of every record under the prefix."""
        states: builtins.list[KeyState] = []
        skipped: builtins.list[Skipped] = []
        for node, batch in self._scan_batches():
            for record_key, reply in self._scan_read(node, batch):
                try:
                    state = self._listed_state(record_key, reply)
                except CorruptRecord as exc:
                    skip(skipped, self._where(record_key.decode("utf-8", "backslashreplace")), exc)
                    continue
                if state is not None and (namespace is None or state.key.namespace == namespace):
                    states.append(state)
        return Listing(states, skipped)

    def _scan_read(self, node: redis.Redis, batch: Sequence[bytes]) -> builtins.list[tuple[bytes, Reply]]:
        """The records of a SCAN's batch, read on their node by one pipeline of read scripts."""
        with self._service("list keys", None):
            pipe = node.pipeline(transaction=False)
            for record_key in batch:
                self._read.queue(pipe, record_key, "", "", "0")
            replies = [
                self._moved(record_key, reply, ("", "", "0"))
                for record_key, reply in zip(batch, pipe.execute(raise_on_error=False), strict=True)
            ]
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
        return [(record_key, cast(Reply, reply)) for record_key, reply in zip(batch, replies, strict=True)]

    # -- the reads a person makes, and removal, through the indexes (.index, .admin) -----------------
    def _indexed(self) -> bool:
        """Whether the admin reads and removals may go through the indexes: the store keeps them, and
        they hold every record (the marker; else this builds them once, logging that it does)."""
        if self._index_ready:
            return True
        if not self._indexes.enabled:
            if not self._told_unindexed:
                self._told_unindexed = True
                logger.warning(
                    "Redis Cluster at %s: the prefix %r has no hash tag, so dibs keeps no index there and "
                    "'dibs ls', 'dibs top', prune and reap read every record; a prefix with a hash tag "
                    "(e.g. prefix={dibs}:) puts every key of the store in one slot and makes them "
                    "cost what they show",
                    self._url,
                    self._prefix,
                )
            return False
        with self._service("read the index marker", None):
            if self._admin.ready():
                self._index_ready = True
                return True
            logger.info(
                "Redis at %s: building the index of the records under %r (records from before it, or "
                "the marker %r was removed); once",
                self._url,
                self._prefix,
                self._indexes.marker,
            )
            placed = self._admin.backfill()
        logger.info("Redis at %s: indexed %d records under %r", self._url, placed, self._prefix)
        self._index_ready = True
        return True

    def rebuild_index(self) -> int:
        """Place every record in its namespace's indexes again and mark them complete; returns how many
        records were placed. For an operator after processes of an older dibs (which write records but
        not the indexes) wrote to this prefix; deleting ``{prefix}idx:ready`` has the same effect at the
        next admin read."""
        if not self._indexes.enabled:
            self._indexed()  # says why there is nothing to build
            return 0
        with self._service("rebuild the index", None):
            placed = self._admin.backfill()
        self._index_ready = True
        return placed

    def page(self, query: pages.Query) -> pages.Page:
        """A page of a status from the indexes; a prunable page (which no index orders) as every store
        that scans finds it."""
        if query.older_than is not None or not self._indexed():
            return super().page(query)
        with self._service("list keys", None):
            return self._admin.page(query)

    def latest(self, namespace: str | None, kind: pages.Kind, *, limit: int) -> builtins.list[KeyState]:
        pages.check_limit(limit)
        if kind not in ("artifact", "failure") or not self._indexed():
            return super().latest(namespace, kind, limit=limit)
        with self._service("read the latest records", None):
            return self._admin.latest(namespace, kind, limit)

    def leases(self, namespace: str | None, *, expired: bool, limit: int) -> builtins.list[KeyState]:
        pages.check_limit(limit)
        if not self._indexed():
            return super().leases(namespace, expired=expired, limit=limit)
        with self._service("read the leases", None):
            return self._admin.leases(namespace, expired, limit)

    def count_states(self, namespace: str | None, *, up_to: int = pages.COUNT_CAP) -> dict[str, int]:
        """Each status counted from the indexes (a few commands a namespace, whatever its size), as
        they stand: a record the indexes do not know (written by an older dibs) is not counted."""
        pages.check_limit(up_to)
        if not self._indexed():
            return super().count_states(namespace, up_to=up_to)
        with self._service("count the keys", None):
            return self._admin.counts(namespace, up_to)

    def reap(self, namespace: str | None = None, *, progress: Progress | None = None) -> int:
        """Expired leases and records that hold nothing, from the indexes, a pipeline of drop scripts
        (``reap``: the expiry judged again on the server's clock, a holder may have renewed) per batch."""
        if not self._indexed():
            expired = lambda key: self._drop_part(key, "expired", "reap")  # noqa: E731
            return reap_each(self, namespace, expired, self.record_key, progress)
        with self._service("reap", None):
            return self._admin.remove(namespace, "reap", 0.0, progress)

    def discard(self, key: Key) -> bool:
        return self._drop_part(key, "empty", "discard")

    def prune(self, namespace: str | None, older_than: float, *, progress: Progress | None = None) -> int:
        """The prunable records, from the indexes (the oldest artifacts, failures and leases, and the
        records that hold nothing), a pipeline of drop scripts (``old``: judged again on the server's
        clock, as :func:`~dibs.stores.transitions.prunable` says) per batch; without indexes, from a
        listing, one script per record."""
        older = _seconds(older_than, "older_than")
        if self._indexed():
            with self._service("prune", None):
                return self._admin.remove(namespace, "old", float(older), progress)
        pruned = 0
        for seen, state in enumerate(self.list(namespace), 1):
            if progress is not None and seen % PROGRESS_EVERY == 0:
                progress(pruned)
            if not transitions.prunable(state, older_than):
                continue
            try:  # the script judges again, on the server's clock
                pruned += self._drop_part(state.key, "old", "prune", older)
            except CorruptRecord as exc:  # damaged since it was listed: skipped, as by list
                skip([], self.record_key(state.key), exc)
        return pruned

    def read_many(self, keys: Sequence[Key]) -> builtins.list[KeyState]:
        """Several keys in one round trip per node (a pipeline of read scripts), for the watch hub."""
        if len(keys) == 1:
            # The hub's usual case (one key changed, every waiter of it woken): the read script
            # called directly, without a pipeline (0.05-0.13 ms less per hand-off, measured).
            # A key the server refuses this user (an ACL's NOPERM: permanent, and per key) is skipped,
            # as the pipeline below skips it: its waiters ask for themselves and get the error. Any
            # other error reply (BUSY, OOM, READONLY, TRYAGAIN, CLUSTERDOWN: the server, not the key,
            # and passing) is StoreUnavailable, so the hub reads again later.
            key = keys[0]
            with self._service("read", key):
                try:
                    reply = self._read(
                        self._reach.client(), self.record_key(key), key.namespace, key.name, "1", _INLINE
                    )
                except redis.exceptions.NoPermissionError:
                    return []
            try:
                state = None if reply[0] == b"corrupt" else self._state(key, reply, with_payload=True)
                full = None if state is None else self._with_payload(state)
            except CorruptRecord:
                return []
            return [] if full is None else [full]  # changed meanwhile: its waiters ask for themselves
        record_keys = [self.record_key(key) for key in keys]
        replies: builtins.list[object] = [None] * len(keys)
        with self._service("read keys", None):
            for node, indexes in self._reach.group(record_keys):
                pipe = node.pipeline(transaction=False)
                for index in indexes:
                    key = keys[index]
                    self._read.queue(pipe, record_keys[index], key.namespace, key.name, "1", _INLINE)
                for index, answer in zip(indexes, pipe.execute(raise_on_error=False), strict=True):
                    key = keys[index]
                    replies[index] = self._moved(
                        record_keys[index], answer, (key.namespace, key.name, "1", _INLINE)
                    )
            for answer in replies:  # as above: only a key refused this user is skipped
                if isinstance(answer, Exception) and not isinstance(
                    answer, redis.exceptions.NoPermissionError
                ):
                    raise answer
        states = []
        for key, answer in zip(keys, replies, strict=True):
            try:
                if isinstance(answer, Exception) or cast(Reply, answer)[0] == b"corrupt":
                    continue  # refused, or damaged: its waiters ask for themselves, and get the error
                full = self._with_payload(self._state(key, cast(Reply, answer), with_payload=True))
            except CorruptRecord:
                continue
            if full is not None:  # changed meanwhile: its waiters ask for themselves
                states.append(full)
        return states

    def _moved(self, record_key: str | bytes, reply: object, args: tuple[str, ...]) -> object:
        """A pipelined read's reply; on a cluster, a key whose slot moved since the pipeline's node was
        chosen (``MOVED``/``ASK``: the read did not run) is read again through the cluster client."""
        if isinstance(reply, redis.exceptions.AskError) and self.settings.topology == "cluster":
            return self._read(self._reach.client(), record_key, *args)
        return reply

    def change_feed(self) -> ChangeFeed:
        """One pattern subscription to every key's channel under the prefix, for the whole process."""
        return PatternFeed(self._reach.subscriber, self._prefix, self._service, self._url)

    def close(self) -> None:
        super().close()
        self._reach.close()

    # -- plumbing -----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _service(self, action: str, key: Key | None) -> Iterator[None]:
        """Translate redis-py's errors into dibs errors; messages name the redacted URL, never secrets."""
        try:
            yield
        except _REDIS_ERRORS as exc:
            raise self._failure(exc, action, key) from exc

    def _failure(self, exc: Exception, action: str, key: Key | None) -> Exception:
        """The dibs error for redis-py's ``exc`` while doing ``action`` (on ``key``).

        :class:`ConfigurationError` for what only a change of settings mends (credentials, rights, a
        URL of the wrong form for the servers it reaches), raised at once; :class:`StoreUnavailable`
        for what passes (a server down, a failover, a slot moving), which the callers' outage policy
        rides out.
        """
        what = f"{action} {key}" if key is not None else action
        wrong_form = self._wrong_form(exc)
        if wrong_form is not None:
            return ConfigurationError(f"Redis at {self._url} cannot {what}: {wrong_form}", url=self._url)
        if isinstance(exc, redis.exceptions.AuthenticationError | redis.exceptions.NoPermissionError) or (
            isinstance(exc, RedisClusterException)
            and isinstance(exc.__cause__, redis.exceptions.AuthenticationError)
        ):
            return ConfigurationError(
                f"Redis at {self._url} refused to {what}: {exc}; check the user and password in the "
                "store URL and the user's ACL: the commands, keys and channels it needs are listed in "
                "docs/deploy-redis.md (keys and channels starting with the prefix)",
                url=self._url,
            )
        unkey = None if key is None else str(key)
        if isinstance(exc, redis.exceptions.ReadOnlyError):
            return StoreUnavailable(
                f"could not {what}: Redis at {self._url} is a read-only replica ({type(exc).__name__}: "
                f"{exc}; a failover may have made it one): point the URL at the master, or follow "
                "failovers with 'redis+sentinel://SENTINEL:26379[,...]/0?service_name=NAME'",
                url=self._url,
                key=unkey,
            )
        # The cluster client's "cannot be connected" carries the node's own error as its cause.
        unreached = exc.__cause__ if isinstance(exc, RedisClusterException) else exc
        if isinstance(unreached, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
            return StoreUnavailable(
                f"could not {what}: {self._reach.noun} at {self._url} did not answer "
                f"({type(exc).__name__}: {exc})",
                url=self._url,
                key=unkey,
            )
        return StoreUnavailable(
            f"could not {what}: {self._reach.noun} at {self._url} answered an error "
            f"({type(exc).__name__}: {exc})",
            url=self._url,
            key=unkey,
        )

    def _wrong_form(self, exc: Exception) -> str | None:
        """Why the URL's form does not fit the servers it reached, if that is what ``exc`` says."""
        topology = self.settings.topology
        cluster_form = (
            "use 'redis+cluster://host:port[,host:port...]' (a plain redis:// URL reaches the keys of one "
            "node only: the others answer MOVED)"
        )
        if isinstance(exc, NotStandalone):
            if exc.mode == "cluster":
                return f"it is a node of a Redis Cluster; {cluster_form}"
            if exc.mode == "sentinel":
                return (
                    "it is a Redis Sentinel, which keeps no data; use "
                    "'redis+sentinel://host:port[,host:port...]/0?service_name=NAME' to reach the master "
                    "it names"
                )
            return f"it is a Redis in {exc.mode} mode, not a standalone server"
        if topology == "server" and isinstance(exc, redis.exceptions.ClusterCrossSlotError):
            # A writing script names its record and the namespace's index keys (slots apart unless the
            # prefix has a hash tag): a cluster node refuses it before it would answer MOVED.
            return (
                f"it is a node of a Redis Cluster (it answered {type(exc).__name__}: {exc}); {cluster_form}"
            )
        if topology == "server" and isinstance(exc, redis.exceptions.AskError):
            return (
                f"it is a node of a Redis Cluster (it answered {type(exc).__name__}: {exc}); {cluster_form}"
            )
        if isinstance(exc, RedisClusterException) and "Cluster mode is not enabled" in str(exc):
            return (
                "the nodes named are not in cluster mode (or the user may not run CLUSTER SLOTS); use "
                "'redis://host:port/0' for one server, or 'redis+sentinel://...' for a Sentinel set"
            )
        if isinstance(exc, UnknownService):
            return f"{exc}; check service_name (SENTINEL MASTERS lists the services a Sentinel monitors)"
        if (
            topology == "sentinel"
            and isinstance(exc, redis.exceptions.ResponseError)
            and "unknown command" in str(exc).lower()
            and "sentinel" in str(exc).lower()
        ):
            return f"the nodes named are not Redis Sentinels ({exc}); name the Sentinels, not the data nodes"
        return None

    def _run(
        self,
        script: Script,
        key: Key,
        action: str,
        *args: str | bytes | int,
        safe: bool = False,
        confirm: Callable[[Reply], bool] | None = None,
    ) -> Reply:
        """Run one script on ``key``'s record; a foreign or damaged record raises :class:`CorruptRecord`.

        Sent again once when the first try failed in a way that says it did not run (a master demoted
        by a failover, a cluster's slot map refreshed after ``CLUSTERDOWN``), or, for a ``safe`` script
        (one whose second run changes nothing the first did not: a read, an acquire, which the same
        owner re-enters, a heartbeat), when the connection broke: a new connection follows a failover
        (the Sentinels' new master, a cluster's new slot map). A ``complete`` or ``release`` whose
        connection broke is not sent again: it may have run, and a second run would report a lease
        lost (the caller settles it by reading the key: :meth:`Lease._settle_complete
        <dibs.lease.Lease._settle_complete>`). With ``min_replicas``, a reply ``confirm`` accepts is
        returned only once the replicas have it (:class:`~dibs.stores.redis.replicas.Unreplicated`
        otherwise).

        A ``try`` rather than :meth:`_service`: the context manager's generator cost ~1 µs of every
        operation (issue 20)."""
        record_key = self.record_key(key)
        more = () if script is self._read else self._indexes.more(key.namespace)
        try:
            reply = self._call(script, record_key, args, confirm, more)
        except _REDIS_ERRORS as exc:
            if not _may_repeat(exc, safe):
                raise self._failure(exc, action, key) from exc
            if isinstance(exc, Demoted):
                self._reach.refresh()  # every idle connection to the old master, not this one alone
            try:
                reply = self._call(script, record_key, args, confirm, more)
            except _REDIS_ERRORS as again:
                raise self._failure(again, action, key) from again
        if reply[0] == b"corrupt":
            # The reason may quote the foreign value (its format, the key it names): never raw.
            raise self._corrupt(key, record_key, printable(reply[1].decode("utf-8", "replace")))
        return reply

    def _call(
        self,
        script: Script,
        record_key: str,
        args: Sequence[str | bytes | int],
        confirm: Callable[[Reply], bool] | None,
        more: Sequence[str] = (),
    ) -> Reply:
        """One run of ``script`` (``more``: the index keys a writing script keeps, see :mod:`.index`)."""
        if confirm is not None and self._replicas is not None:
            return self._replicas.run(script, record_key, args, confirm, more)
        return script(self._reach.client(), record_key, *args, more=more)

    def _drop_part(self, key: Key, part: str, action: str, *more: str) -> bool:
        reply = self._run(self._drop, key, action, key.namespace, key.name, self.channel(key), part, *more)
        return bool(reply[0] == b"changed")

    def _where(self, record_key: str) -> str:
        return f"Redis key {record_key!r} on {self._url}"

    def _corrupt(self, key: Key | None, record_key: str, why: str) -> CorruptRecord:
        return decoder.corrupt(key, self._where(record_key), why)

    def _scan_batches(self) -> Iterator[tuple[redis.Redis, Sequence[bytes]]]:
        """The record keys of every node that holds keys, in batches, each with its node's client.

        Keys stay bytes: a foreign key under the prefix need not be UTF-8, and must still be reported.
        A key that moves to another node during the scan (a cluster resharding) may be listed twice or
        missed, as SCAN itself may; the listing never reports a record the store does not hold."""
        with self._service("list keys", None):
            nodes = self._reach.primaries()
        for node in nodes:
            with self._service("list keys", None):
                batch: builtins.list[bytes] = []
                for raw in node.scan_iter(match=f"{self._prefix}rec:*", count=SCAN_BATCH):
                    batch.append(raw)
                    if len(batch) >= SCAN_BATCH:
                        yield node, batch
                        batch = []
                if batch:
                    yield node, batch

    def _listed_state(self, raw_key: bytes, reply: Reply) -> KeyState | None:
        """A listed record's state, after checking it is the record its Redis key says it is."""
        record_key = raw_key.decode("utf-8", "backslashreplace")
        if reply[0] == b"corrupt":
            raise self._corrupt(None, record_key, printable(reply[1].decode("utf-8", "replace")))
        if reply[3] is None:  # no format: deleted between SCAN and the read
            return None
        digest = record_key.removeprefix(f"{self._prefix}rec:")
        return self._state(None, reply, record_key=record_key, digest=digest)

    def _state(
        self,
        key: Key | None,
        reply: Reply,
        *,
        with_payload: bool = False,
        record_key: str | None = None,
        digest: str | None = None,
    ) -> KeyState:
        """Build the :class:`KeyState` a script returned (``{status, now, extra, FIELDS...[, payload]}``)
        with the shared decoder (:mod:`dibs.stores.decoder`), reading every value as text."""
        fields = dict(zip(FIELDS, reply[3 : 3 + len(FIELDS)], strict=True))
        now = float(reply[1])
        if key is not None and fields["format"] is None:
            return KeyState(key=key, now=now)
        payload = reply[3 + len(FIELDS)] if with_payload else b""
        return self._decode(key, fields, now, payload=payload, record_key=record_key, digest=digest)

    def _decode(
        self,
        key: Key | None,
        fields: dict[str, object],
        now: float,
        *,
        payload: bytes | None = b"",
        record_key: str | None = None,
        digest: str | None = None,
    ) -> KeyState:
        if record_key is None:
            assert key is not None
            record_key = self.record_key(key)
        return decoder.decode(
            fields,
            key,
            now,
            where=self._where(record_key),
            digest=digest,
            textual=True,
            expected_format=FORMAT,
            payload=bytes(payload or b""),
        )
