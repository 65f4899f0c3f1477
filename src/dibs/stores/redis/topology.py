"""How the Redis store reaches Redis: one server, a Redis Cluster, or the master a Sentinel set names.

The store runs the same scripts on all three; what differs is only which client sends them, which
nodes hold keys to list, and where the change feed listens. Each :class:`Reach` answers those
questions for its topology:

* :class:`ServerReach`: one bounded pool (``BlockingConnectionPool``). Each new connection asks the
  server what it is (``INFO server``): a URL of this form that reaches a cluster node or a Sentinel is a
  :class:`NotStandalone` error at once, which the store words as a configuration error naming the right
  URL form (a cluster node answers ``MOVED`` for two keys in three, which looked like a passing failure).
* :class:`ClusterReach`: redis-py's ``RedisCluster`` (built at the first operation: it asks a node for
  the slot map when it is built), a bounded pool per node, no retries of its own but following
  ``MOVED``/``ASK``/``TRYAGAIN``, which mean the command did not run. Listing scans every primary.
* :class:`SentinelReach`: redis-py's ``Sentinel`` finds the master; connections to a master that has
  become a replica (``READONLY``: a failover) are dropped and the master is asked for again, and the
  refusal is raised as :class:`Demoted`, which says the command did not run.
"""

from __future__ import annotations

import abc
import contextlib
import itertools
import re
import threading
from collections.abc import Sequence
from typing import Any, cast

import redis
import redis.exceptions
from redis.cluster import ClusterNode, RedisCluster
from redis.connection import BlockingConnectionPool, Connection, SSLConnection
from redis.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPool, SentinelManagedConnection

from dibs.stores.redis.settings import CLIENT_DEFAULTS, DEFAULT_MAX_CONNECTIONS, RedisSettings

__all__ = [
    "ClusterReach",
    "Demoted",
    "NotStandalone",
    "Reach",
    "SentinelReach",
    "ServerReach",
    "UnknownService",
    "reach",
]

#: A client that runs commands: one server's (``redis.Redis``) or a cluster's.
Client = redis.Redis | RedisCluster


class NotStandalone(redis.exceptions.ConnectionError):
    """A ``redis://`` URL reached a server that is not a standalone Redis: a cluster node or a Sentinel."""

    def __init__(self, mode: str) -> None:
        super().__init__(f"the server is a Redis {mode} (INFO server: redis_mode:{mode})")
        self.mode = mode


class Demoted(redis.exceptions.ConnectionError):
    """The master a Sentinel named answered ``READONLY``: it is a replica now (a failover). The command
    was refused, so nothing ran; the connection is dropped and the next one asks the Sentinels again."""


class UnknownService(MasterNotFoundError):
    """Sentinels answered, and none of them monitors the service the URL names."""


def _standalone(connection: Any) -> None:
    """A new connection's own set-up, then the server's ``redis_mode``: anything but standalone is
    :class:`NotStandalone`. A user that may not run ``INFO`` skips the check (``MOVED`` still tells)."""
    connection.on_connect()
    connection.send_command("INFO", "server")
    try:
        info = connection.read_response()
    except redis.exceptions.ResponseError:  # NOPERM: INFO is not granted; not a reason to fail
        return
    text = info.decode("utf-8", "replace") if isinstance(info, bytes) else str(info)
    found = re.search(r"^redis_mode:(\w+)", text, re.MULTILINE)
    if found is not None and found.group(1) != "standalone":
        raise NotStandalone(found.group(1))


def _pool_options() -> dict[str, Any]:
    return {"max_connections": DEFAULT_MAX_CONNECTIONS, "timeout": CLIENT_DEFAULTS["socket_timeout"]}


class Reach(abc.ABC):
    """The clients of one store for one topology. Not thread-bound: every method may be called from
    any thread."""

    topology: str
    #: What the store's messages call the place: "Redis", "Redis Cluster", "Redis Sentinel master".
    noun = "Redis"

    def __init__(self, settings: RedisSettings) -> None:
        self.settings = settings

    @abc.abstractmethod
    def client(self) -> Client:
        """The client that runs commands (routing each by its key on a cluster)."""

    @abc.abstractmethod
    def primaries(self) -> list[redis.Redis]:
        """A client per node that holds keys: the one server, the master, or every cluster primary."""

    def node_of(self, record_key: str | bytes) -> redis.Redis:
        """The client of the node that serves ``record_key`` (for pipelines and a pinned ``WAIT``)."""
        return cast(redis.Redis, self.client())

    def group(self, record_keys: Sequence[str | bytes]) -> list[tuple[redis.Redis, list[int]]]:
        """``record_keys``' indexes grouped by the node that serves them (one group off a cluster)."""
        return [(self.node_of(record_keys[0]), list(range(len(record_keys))))] if record_keys else []

    def subscriber(self) -> redis.Redis:
        """The client whose ``pubsub()`` the change feed listens on."""
        return cast(redis.Redis, self.client())

    def refresh(self) -> None:  # noqa: B027 - one server has nothing to find again
        """Find the topology again after an answer that says it changed (``MOVED``, a broken
        connection, a demoted master). Best effort: never raises (the next operation says what is
        wrong)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close every connection."""


class ServerReach(Reach):
    topology = "server"

    def __init__(self, settings: RedisSettings) -> None:
        super().__init__(settings)
        # One bounded pool per store, shared by every client of the process (dibs.runtime): the watch
        # hub's subscription holds one connection of it, operations the rest, and a caller finding them
        # all busy waits for one instead of opening more (DEFAULT_MAX_CONNECTIONS).
        pool = BlockingConnectionPool.from_url(
            settings.client_url, redis_connect_func=_standalone, **_pool_options(), **CLIENT_DEFAULTS
        )
        self._client = redis.Redis(connection_pool=pool)
        # The pool creates connections lazily; building one (without connecting) now turns an unknown
        # or malformed query option into a configuration error instead of a failure on the first call.
        pool.connection_class(**pool.connection_kwargs)

    def client(self) -> redis.Redis:
        return self._client

    def primaries(self) -> list[redis.Redis]:
        return [self._client]

    def close(self) -> None:
        self._client.close()
        self._client.connection_pool.disconnect()


class _DemotingConnection(SentinelManagedConnection):
    """redis-py's Sentinel connection, raising :class:`Demoted` where it raises a plain
    ``ConnectionError`` for ``READONLY``: the store may then repeat even a write (nothing ran)."""

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return Connection.read_response(self, *args, **kwargs)
        except redis.exceptions.ReadOnlyError as exc:
            if self.connection_pool.is_master:
                self.disconnect()  # type: ignore[no-untyped-call]
                raise Demoted(f"the master named by the Sentinels is a replica now ({exc})") from exc
            raise


class _DemotingSSLConnection(_DemotingConnection, SSLConnection):
    pass


class _BlockingSentinelPool(SentinelConnectionPool, BlockingConnectionPool):
    """redis-py's Sentinel pool, bounded as the one server's is (it is unbounded otherwise)."""


class _Sentinel(Sentinel):
    def discover_master(self, service_name: str) -> tuple[str, int]:
        """The master's address; :class:`UnknownService` when Sentinels answer but none knows
        ``service_name`` (a typo does not pass, unlike a failover in progress)."""
        try:
            found: Any = super().discover_master  # untyped in redis-py
            return cast(tuple[str, int], found(service_name))
        except MasterNotFoundError:
            answered, known, told = False, False, []
            for sentinel in self.sentinels:
                kwargs = sentinel.connection_pool.connection_kwargs
                where = f"{kwargs.get('host')}:{kwargs.get('port')}"
                try:
                    masters = sentinel.sentinel_masters()
                except redis.exceptions.AuthenticationError as exc:
                    # Not a passing failure: the credentials (sentinel_username, sentinel_password).
                    raise redis.exceptions.AuthenticationError(
                        f"the Sentinel at {where} refused: {exc}"
                    ) from exc
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
                    told.append(f"{where} did not answer ({type(exc).__name__}: {exc})")
                    continue
                answered = True
                known = known or service_name in masters
                told.append(
                    f"{where} knows no master up" if service_name in masters else f"{where} knows none"
                )
            if answered and not known:
                raise UnknownService(f"no Sentinel monitors a service named {service_name!r}") from None
            # Not redis-py's own message, which holds the repr of every Sentinel's client (long).
            raise MasterNotFoundError(f"no master found for {service_name!r}: {'; '.join(told)}") from None


class SentinelReach(Reach):
    topology = "sentinel"
    noun = "Redis (through Sentinel)"

    def __init__(self, settings: RedisSettings) -> None:
        super().__init__(settings)
        parse: Any = redis.connection.parse_url  # untyped in redis-py
        options: dict[str, Any] = parse(settings.client_url)
        for name in ("host", "port", "connection_class"):
            options.pop(name, None)
        sentinel_options: dict[str, Any] = {
            name: value
            for name, value in {**CLIENT_DEFAULTS, **options}.items()
            if name.startswith("socket_")
        }
        if settings.sentinel_username is not None:
            sentinel_options["username"] = settings.sentinel_username
        if settings.sentinel_password is not None:
            sentinel_options["password"] = settings.sentinel_password
        if settings.tls:
            sentinel_options["ssl"] = True
            for name, value in options.items():
                if name.startswith("ssl_"):
                    sentinel_options[name] = value
        sentinel_options["retry"] = CLIENT_DEFAULTS["retry"]
        make: Any = _Sentinel  # untyped in redis-py
        sentinel: Any = make(list(settings.nodes), sentinel_kwargs=sentinel_options)
        self._sentinel = sentinel
        assert settings.service_name is not None
        self._client: redis.Redis = sentinel.master_for(
            settings.service_name,
            connection_pool_class=_BlockingSentinelPool,
            connection_class=_DemotingSSLConnection if settings.tls else _DemotingConnection,
            **{**_pool_options(), **CLIENT_DEFAULTS, **options},
        )
        pool = self._client.connection_pool
        pool.connection_class(**pool.connection_kwargs)  # unknown options fail now, as above

    def client(self) -> redis.Redis:
        return self._client

    def primaries(self) -> list[redis.Redis]:
        return [self._client]

    def refresh(self) -> None:
        """Drop the idle connections (each may be to a demoted master): the next ones ask the
        Sentinels where the master is."""
        pool: Any = self._client.connection_pool
        pool.disconnect(inuse_connections=False)

    def close(self) -> None:
        self._client.close()
        self._client.connection_pool.disconnect()
        self._sentinel.close()


class ClusterReach(Reach):
    topology = "cluster"
    noun = "Redis Cluster"

    def __init__(self, settings: RedisSettings) -> None:
        super().__init__(settings)
        self._lock = threading.Lock()
        self._cluster: RedisCluster | None = None
        self._turn = itertools.count()

    def client(self) -> RedisCluster:
        cluster = self._cluster
        if cluster is None:
            with self._lock:
                if self._cluster is None:
                    self._cluster = self._connect()
                cluster = self._cluster
        return cluster

    def _connect(self) -> Any:
        """The cluster client, which reads the slot map from the first node that answers."""
        others = self.settings.nodes[1:]  # the first is the URL's
        options = {**CLIENT_DEFAULTS, **_pool_options()}
        # Not transparent retries (they would run a complete twice): MOVED, ASK and TRYAGAIN are still
        # followed, since they mean the command did not run. redis-py takes the retry at this level.
        retry = options.pop("retry")
        options.pop("health_check_interval")  # the cluster client does not pass it to its nodes
        return RedisCluster(
            url=self.settings.client_url,
            startup_nodes=[_node(host, port) for host, port in others],
            retry=retry,
            # A master down (no replica to promote) makes its slots fail, not the whole store.
            require_full_coverage=False,
            connection_pool_class=BlockingConnectionPool,
            **options,
        )

    def primaries(self) -> list[redis.Redis]:
        cluster: Any = self.client()
        return [cluster.get_redis_connection(node) for node in cluster.get_primaries()]

    def node_of(self, record_key: str | bytes) -> redis.Redis:
        cluster: Any = self.client()
        return cast(redis.Redis, cluster.get_redis_connection(cluster.get_node_from_key(record_key)))

    def group(self, record_keys: Sequence[str | bytes]) -> list[tuple[redis.Redis, list[int]]]:
        cluster: Any = self.client()
        groups: dict[str, tuple[redis.Redis, list[int]]] = {}
        for index, record_key in enumerate(record_keys):
            node = cluster.get_node_from_key(record_key)
            groups.setdefault(node.name, (cluster.get_redis_connection(node), []))[1].append(index)
        return list(groups.values())

    def subscriber(self) -> redis.Redis:
        """A different node at each call (the feed calls it again after a failure): a cluster hands
        every ``PUBLISH`` to every node, so any node that answers hears every key's channel."""
        cluster: Any = self.client()
        nodes = sorted(cluster.get_nodes(), key=lambda node: node.name)
        node = nodes[next(self._turn) % len(nodes)]
        return cast(redis.Redis, cluster.get_redis_connection(node))

    def refresh(self) -> None:
        # No node answers now: the next operation says so.
        with contextlib.suppress(redis.exceptions.RedisError, redis.exceptions.RedisClusterException):
            self.client().nodes_manager.initialize()

    def close(self) -> None:
        with self._lock:
            cluster, self._cluster = self._cluster, None
        if cluster is not None:
            cluster.close()


def _node(host: str, port: int) -> ClusterNode:
    make: Any = ClusterNode  # untyped in redis-py
    return cast(ClusterNode, make(host, port))


def reach(settings: RedisSettings) -> Reach:
    """The :class:`Reach` of ``settings``' topology (nothing is contacted yet)."""
    kinds: dict[str, type[Reach]] = {
        "server": ServerReach,
        "cluster": ClusterReach,
        "sentinel": SentinelReach,
    }
    return kinds[settings.topology](settings)
