"""The Redis store's connection settings: the URL, checked before redis-py sees it, and the client
defaults it overrides.

Three forms, one per way of running Redis (:mod:`.topology` builds the client for each):

* ``redis://[user:password@]host[:port][/db][?options]`` (``rediss://`` for TLS): one server;
* ``redis+cluster://[user:password@]host:port[,host:port...][?options]`` (``rediss+cluster://``): a
  Redis Cluster, found from any of the nodes named (database 0 only: a cluster has no other);
* ``redis+sentinel://[user:password@]host:port[,host:port...][/db]?service_name=NAME[&options]``
  (``rediss+sentinel://``): the master of ``NAME`` as the Sentinels named report it, followed through
  failovers. The user and password are the data nodes'; ``sentinel_username`` and
  ``sentinel_password`` are the Sentinels' own, when they ask for one.

Options every form takes: ``prefix`` (default ``dibs:``) starts every Redis key dibs writes;
``max_artifact_size`` (bytes) sets a limit below the server's own; ``min_replicas`` (0) makes every
grant and every complete wait until that many replicas have it (``WAIT``), for at most
``replica_timeout`` seconds (1), see :mod:`dibs.stores.redis`; and redis-py's connection options
(``socket_timeout``, ``max_connections``, ``ssl_cert_reqs``, ...). ``decode_responses`` is refused
(the store reads replies as bytes). On one server every other option is handed to redis-py's
connection pool as it was; a cluster or a Sentinel set takes the connection options listed in
:data:`CONNECTION_OPTIONS` (redis-py's cluster client drops an option it does not know without a
word, so dibs names it instead).
"""

from __future__ import annotations

import dataclasses
import re
import urllib.parse
from collections.abc import Callable
from typing import Any, Literal

from redis.backoff import NoBackoff
from redis.retry import Retry

from dibs.config import validate_seconds
from dibs.errors import ConfigurationError
from dibs.stores import url_userinfo

__all__ = [
    "CLIENT_DEFAULTS",
    "CONNECTION_OPTIONS",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_PREFIX",
    "DEFAULT_REPLICA_TIMEOUT",
    "SCAN_BATCH",
    "RedisSettings",
    "Topology",
    "parse_url",
]

DEFAULT_PREFIX = "dibs:"
# Only characters that mean nothing to SCAN's glob MATCH, so a prefix can never select foreign keys;
# braces for a Redis Cluster hash tag (``{dibs}:``: every key of the store in one slot, so the
# scripts may keep the namespaces' indexes there: dibs.stores.redis.index).
_PREFIX_RE = re.compile(r"[A-Za-z0-9_.:/|{}-]{1,100}")
# Connection defaults; the URL's query options override them (redis-py lets the URL win).
CLIENT_DEFAULTS: dict[str, Any] = {
    "socket_connect_timeout": 5.0,
    "socket_timeout": 10.0,
    # A PING before reusing a connection idle this long finds dead sockets before a script is sent.
    "health_check_interval": 30,
    # No transparent retries: a script whose reply was lost may have run, and running complete or
    # release twice would turn a success into a LeaseLost. The store repeats only what is safe
    # (dibs.stores.redis.store), and the caller's policy retries the rest.
    "retry": Retry(NoBackoff(), 0),
}
#: Keys per SCAN round trip and per pipeline of reads; also the most channels one feed call takes.
SCAN_BATCH = 500
#: Connections per store and process, the watch hub's subscription included (``?max_connections=``);
#: on a cluster, per node.
DEFAULT_MAX_CONNECTIONS = 4
#: Seconds a grant or a complete waits for ``min_replicas`` replicas to confirm it (``?replica_timeout=``).
DEFAULT_REPLICA_TIMEOUT = 1.0

Topology = Literal["server", "cluster", "sentinel"]

_SCHEMES: dict[str, tuple[Topology, bool]] = {
    "redis": ("server", False),
    "rediss": ("server", True),
    "redis+cluster": ("cluster", False),
    "rediss+cluster": ("cluster", True),
    "redis+sentinel": ("sentinel", False),
    "rediss+sentinel": ("sentinel", True),
}
_FORMS = (
    "'redis://[user:password@]host[:port][/db][?prefix=dibs:]', "
    "'redis+cluster://[user:password@]host:port[,host:port...][?prefix=dibs:]' or "
    "'redis+sentinel://[user:password@]host:port[,host:port...][/db]?service_name=NAME' "
    "('rediss' for TLS)"
)

#: The redis-py connection options a cluster or a Sentinel set takes from the URL (one server takes
#: any option redis-py's pool knows).
CONNECTION_OPTIONS = frozenset(
    {
        "socket_timeout",
        "socket_connect_timeout",
        "socket_keepalive",
        "health_check_interval",
        "max_connections",
        "client_name",
        "ssl_cert_reqs",
        "ssl_ca_certs",
        "ssl_ca_path",
        "ssl_certfile",
        "ssl_keyfile",
        "ssl_password",
        "ssl_check_hostname",
    }
)
_SENTINEL_OPTIONS = frozenset({"service_name", "sentinel_username", "sentinel_password"})
#: Query options that are durations in seconds (``True``: 0 is allowed, it turns the option off).
_DURATIONS = {"socket_timeout": False, "socket_connect_timeout": False, "health_check_interval": True}


@dataclasses.dataclass(frozen=True)
class RedisSettings:
    """A store URL, checked: where Redis is, how to reach it, and what dibs itself takes from it."""

    topology: Topology
    #: The URL with its secrets hidden (:func:`dibs.stores.redact_url`): the one way it is shown.
    redacted: str
    #: One server: the URL redis-py's pool gets (dibs's own options taken out). A cluster or a
    #: Sentinel set: ``redis[s]://[user:password@]FIRST-NODE[/db]?options``, whose user, password,
    #: database and options redis-py's URL parser turns into connection arguments for every node.
    client_url: str
    #: Every ``(host, port)`` the URL names: the cluster's nodes or the Sentinels (one server: its own).
    nodes: tuple[tuple[str, int], ...]
    prefix: str
    max_size: int | None
    min_replicas: int = 0
    replica_timeout: float = DEFAULT_REPLICA_TIMEOUT
    tls: bool = False
    service_name: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = None

    def bad(self, problem: str) -> ConfigurationError:
        return _bad(self.redacted, problem)

    def connection_value(self, name: str) -> float:
        """A duration the URL set (``socket_timeout``...), or the client's default for it."""
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.client_url).query)
        return float(query[name][-1]) if name in query else float(CLIENT_DEFAULTS[name])


def _bad(redacted: str, problem: str) -> ConfigurationError:
    return ConfigurationError(
        f"invalid Redis store URL {redacted!r}: {problem}; expected {_FORMS}", url=redacted
    )


def _check_duration(name: str, text: str, bad: Callable[[str], ConfigurationError]) -> float:
    """A duration option through the one rule for durations; redis-py would accept NaN or 1e300 and
    fail later, inside a socket call, with ``OverflowError``."""
    try:
        value = float(text)
    except ValueError:
        raise bad(f"{name}={text!r} is not a number of seconds") from None
    try:
        seconds = validate_seconds(name, value, allow_zero=_DURATIONS.get(name, False))
    except ConfigurationError as exc:
        raise bad(exc.message) from None
    assert seconds is not None
    return seconds


def _whole(name: str, text: str, bad: Callable[[str], ConfigurationError], least: int) -> int:
    if not text.isdigit() or int(text) < least:
        raise bad(f"{name}={text!r} is not a whole number, {least} or more")
    return int(text)


def _split_hosts(
    hostlist: str, bad: Callable[[str], ConfigurationError], default_port: int | None
) -> list[tuple[str, int]]:
    """``host:port[,host:port...]`` (``[v6]:port`` too) as pairs, each checked."""
    nodes = []
    for item in hostlist.split(","):
        match = re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[^\[\]:/?#@,]+)(?::(\d*))?", item)
        if match is None:
            raise bad(f"{item!r} is not host:port")
        host, port_text = match.group(1).strip("[]"), match.group(2)
        if not port_text:
            if default_port is None:
                raise bad(f"{item!r} names no port (host:port)")
            port_text = str(default_port)
        port = int(port_text)
        if not 0 < port < 65536:
            raise bad(f"the port of {item!r} is not 1 to 65535")
        nodes.append((host, port))
    return nodes


_OWN_OPTIONS = frozenset({"max_artifact_size", "min_replicas", "replica_timeout"})


def parse_url(url: str, redacted: str) -> RedisSettings:
    """Check ``url`` (shown as ``redacted`` in every error) and split it into :class:`RedisSettings`."""

    def bad(problem: str) -> ConfigurationError:
        return _bad(redacted, problem)

    if not isinstance(url, str):
        raise bad(f"a URL must be a string, got {type(url).__name__}")
    scheme, sep, _ = url.partition("://")
    if not sep or scheme.lower() not in _SCHEMES:
        raise bad(f"the scheme is {scheme!r}, not one of {', '.join(map(repr, _SCHEMES))}")
    topology, tls = _SCHEMES[scheme.lower()]
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError as exc:
        raise bad(str(exc)) from exc
    nodes = _nodes(url, parts, topology, bad)
    kept, prefix, found = _query(parts.query, topology, bad)
    max_size = None
    if "max_artifact_size" in found:
        max_size = _whole("max_artifact_size", found["max_artifact_size"], bad, 1)
    min_replicas = _whole("min_replicas", found["min_replicas"], bad, 0) if "min_replicas" in found else 0
    replica_timeout = DEFAULT_REPLICA_TIMEOUT
    if "replica_timeout" in found:
        if not min_replicas:
            raise bad("replica_timeout is set without min_replicas (it bounds the wait for replicas)")
        replica_timeout = _check_duration("replica_timeout", found["replica_timeout"], bad)
    service_name = found.get("service_name")
    if topology == "sentinel" and not service_name:
        raise bad("it names no service: add ?service_name=NAME (the name the Sentinels monitor)")
    # Every form goes to redis-py as one node's URL: its own parser then reads the user, password,
    # database and options the same way for every node (and keeps them percent-decoded alike).
    netloc = parts.netloc
    if topology != "server":
        login = parts.netloc.rpartition("@")[0]
        host, port = nodes[0]
        hostport = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        netloc = f"{login}@{hostport}" if login else hostport
    client_url = urllib.parse.urlunsplit(
        ("rediss" if tls else "redis", netloc, parts.path, "&".join(kept), parts.fragment)
    )
    settings = RedisSettings(
        topology=topology,
        redacted=redacted,
        client_url=client_url,
        nodes=tuple(nodes),
        prefix=prefix,
        max_size=max_size,
        min_replicas=min_replicas,
        replica_timeout=replica_timeout,
        tls=tls,
        service_name=service_name,
        sentinel_username=found.get("sentinel_username"),
        sentinel_password=found.get("sentinel_password"),
    )
    if min_replicas and replica_timeout >= settings.connection_value("socket_timeout"):
        raise bad(
            f"replica_timeout={replica_timeout:g} is not below socket_timeout "
            f"({settings.connection_value('socket_timeout'):g} s): the wait for replicas would be cut off "
            "as a dead connection"
        )
    return settings


def _nodes(
    url: str, parts: urllib.parse.SplitResult, topology: Topology, bad: Callable[[str], ConfigurationError]
) -> list[tuple[str, int]]:
    """The servers ``url`` names, after checking its user part, port(s) and database."""
    userinfo = url_userinfo(url)
    if userinfo is not None and ":" in userinfo and not parts.netloc.startswith(userinfo + "@"):
        # redis-py splits the host off at the first '/', '?' or '#': an unencoded password holding one
        # would be sent cut short, and its tail quoted back as a database number, a port or a host.
        raise bad(
            "its password (or an option value after it) contains an unencoded '/', '?', '#' or '@'; "
            "percent-encode them (%2F, %3F, %23, %40). The password is not shown"
        )
    if topology == "server":
        try:
            parts.port  # noqa: B018 -- urllib checks the port only when asked
        except ValueError as exc:
            raise bad(str(exc)) from exc
        nodes = [(parts.hostname or "localhost", parts.port or 6379)]
    else:
        hostlist = parts.netloc.rpartition("@")[2]
        if not hostlist:
            raise bad("it names no node (host:port[,host:port...])")
        nodes = _split_hosts(hostlist, bad, 26379 if topology == "sentinel" else None)
    if parts.path not in {"", "/"} and not re.fullmatch(r"/\d+", parts.path):
        raise bad(f"the database {parts.path.lstrip('/')!r} is not a number (use e.g. '/0')")
    if topology == "cluster" and parts.path not in {"", "/", "/0"}:
        raise bad(f"a Redis Cluster has only database 0, not {parts.path.lstrip('/')}")
    return nodes


def _query(
    query: str, topology: Topology, bad: Callable[[str], ConfigurationError]
) -> tuple[list[str], str, dict[str, str]]:
    """The URL's options: those handed on to redis-py (as written), the prefix, and dibs's own."""
    kept, prefixes = [], []
    found: dict[str, str] = {}
    own = _OWN_OPTIONS | (_SENTINEL_OPTIONS if topology == "sentinel" else frozenset())
    for item in query.split("&") if query else []:
        raw_name, _, value = item.partition("=")
        name, text = urllib.parse.unquote(raw_name), urllib.parse.unquote(value)
        if name == "prefix":
            prefixes.append(text)
        elif name == "decode_responses":
            # redis-py would hand every reply over as str; the store reads bytes (payloads are bytes).
            raise bad(f"decode_responses={text!r}: dibs reads replies as bytes; leave it out")
        elif name in _SENTINEL_OPTIONS and topology != "sentinel":
            raise bad(f"{name!r} is an option of 'redis+sentinel://' URLs only")
        elif name in {"cluster", "sentinel"}:
            # Not options of redis-py's pool (it would fail with a bare TypeError): a URL form each.
            raise bad(f"{name}={text!r}: a Redis {name.title()} is named by the scheme, 'redis+{name}://'")
        elif name in own:
            if name in found:
                raise bad(f"{name!r} is given twice")
            found[name] = text
        else:
            if name in _DURATIONS:
                _check_duration(name, text, bad)
            if topology != "server" and name not in CONNECTION_OPTIONS:
                raise bad(
                    f"{name!r} is not an option of a {topology} URL; it takes prefix, "
                    f"{', '.join(sorted(own))} and {', '.join(sorted(CONNECTION_OPTIONS))}"
                )
            kept.append(item)  # handed on byte for byte: redis-py unquotes the values itself
    if len(prefixes) > 1:
        raise bad(f"'prefix' is given {len(prefixes)} times")
    prefix = prefixes[0] if prefixes else DEFAULT_PREFIX
    if not _PREFIX_RE.fullmatch(prefix):
        raise bad(
            f"the prefix {prefix!r} is not 1 to 100 of letters, digits and '_.:/|{{}}-' (e.g. 'dibs:', "
            "'team-a:dibs:', or '{dibs}:' on a Redis Cluster)"
        )
    return kept, prefix, found
