"""Real Redis topologies on loopback for the tests and benchmarks: a Redis Cluster, a Sentinel set.

Every server is a real ``redis-server`` process (``/usr/bin/redis-server``, installed by
``scripts/install-redis-server.sh``) on a free port, started as an operator would start it, with its
own folder and log (:class:`tests.components.Component`). Nothing is waited for by sleeping: each
step waits for the condition it needs (a node answering, the cluster's state ``ok`` on every node, a
replica's link up, every Sentinel naming the same master), polling with a generous bound, and a
failure shows the servers' logs.

* :class:`Cluster`: ``--cluster-enabled yes`` nodes joined by ``redis-cli --cluster create``,
  ``--cluster-replicas 0`` (or with replicas added one by one).
* :class:`SentinelSet`: a master, its replicas (``--replicaof``), and Sentinels
  (``redis-server sentinel.conf --sentinel``), with :meth:`SentinelSet.failover`.

A test module gets one of each per process through :func:`shared_cluster` and
:func:`shared_sentinels` (each test then works under a key prefix of its own, as on the shared
server), or builds its own with ``with Cluster.start(...)`` when it breaks one.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from tests.components import Component, free_port, stop_together

__all__ = [
    "Cluster",
    "RedisServer",
    "SentinelSet",
    "TopologyError",
    "delete_prefix",
    "missing",
    "shared_cluster",
    "shared_sentinels",
]

T = TypeVar("T")
#: Seconds: an upper bound a working machine never comes near (a cluster converges in about one).
BOUND = 60.0
SERVICE = "dibs-test"


class TopologyError(RuntimeError):
    """A topology did not come up, or did not reach the state asked for, within :data:`BOUND`."""


def missing() -> str | None:
    """Why topologies cannot be started here (``redis-server`` or ``redis-cli`` not on PATH), or None."""
    for program in ("redis-server", "redis-cli"):
        if shutil.which(program) is None:
            return f"{program} is not installed (scripts/install-redis-server.sh installs it)"
    return None


def _client(port: int, **options: Any) -> Any:
    import redis

    return redis.Redis(port=port, socket_connect_timeout=2, socket_timeout=10, **options)


class RedisServer:
    """One ``redis-server`` (a data node, or a Sentinel) on loopback, in a folder of its own."""

    def __init__(self, name: str, folder: Path, port: int, config: Sequence[str], *, sentinel: bool = False):
        self.name, self.folder, self.port, self.sentinel = name, folder, port, sentinel
        self.config = list(config)
        self.component: Component | None = None
        self.bus_port = 0  # a cluster node's bus port
        self.stopped = False  # on purpose: waits do not take its exit for a crash
        self.password: str | None = None  # what it asks clients for (requirepass)

    def start(self) -> RedisServer:
        self.folder.mkdir(parents=True, exist_ok=True)
        if self.sentinel:  # a Sentinel rewrites its configuration file: it must be a file
            conf = self.folder / "sentinel.conf"
            if not conf.exists():
                conf.write_text("\n".join(self.config) + "\n")
            argv = ["redis-server", str(conf), "--sentinel"]
        else:
            argv = ["redis-server", *self.config]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}  # where missing() found redis-server
        self.component = Component(self.name, argv, env, self.folder, self.folder)
        self.stopped = False
        return self

    def alive(self) -> bool:
        return self.component is not None and self.component.alive()

    def answers(self) -> bool:
        try:
            with contextlib.closing(self.client()) as client:
                return bool(client.ping())
        except Exception:
            return False

    def client(self, **options: Any) -> Any:
        """A plain redis-py client on this server (the caller closes it)."""
        return _client(self.port, **({"password": self.password} if self.password else {}), **options)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop the server (SIGKILL: as a crash) and wait until its process is gone."""
        self.stopped = True
        if self.component is not None:
            self.component.send(sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.component.proc.wait(BOUND)
            self.component.send(signal.SIGKILL)
            self.component.proc.wait(BOUND)

    def tail(self) -> str:
        return self.component.tail() if self.component is not None else f"--- {self.name}: not started"

    def restart(self) -> RedisServer:
        """Start the server again on its port, from its folder (a cluster node rejoins from its
        ``nodes.conf``), once its process is gone."""
        return self.start()


def wait_until(
    condition: Callable[[], T | None], what: str, servers: Sequence[RedisServer], bound: float = BOUND
) -> T:
    """Poll ``condition`` until it returns something truthy; :class:`TopologyError` (with the servers'
    logs) after ``bound`` seconds, or at once when a server that was started has exited."""
    deadline = time.monotonic() + bound
    while True:
        try:
            value = condition()
        except Exception:  # a server still starting, a topology still changing
            value = None
        if value:
            return value
        dead = [s.name for s in servers if s.component is not None and not s.stopped and not s.alive()]
        if dead or time.monotonic() > deadline:
            why = f"{', '.join(dead)} exited" if dead else f"gave up after {bound:g}s"
            raise TopologyError(f"{why} while waiting for {what}\n" + "\n".join(s.tail() for s in servers))
        time.sleep(0.05)


def _data_node(name: str, folder: Path, *extra: str) -> RedisServer:
    port = free_port()
    config = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    # A replica's first sync starts at once (Redis 7 waits 5 s for more replicas to share it).
    config += ["--repl-diskless-sync-delay", "0", *extra]
    return RedisServer(name, folder / name, port, config)


class _Topology:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.servers: list[RedisServer] = []

    def wait_until(self, condition: Callable[[], T | None], what: str, bound: float = BOUND) -> T:
        return wait_until(condition, what, self.servers, bound)

    def stop(self) -> None:
        stop_together([server.component for server in self.servers if server.component is not None])

    def __enter__(self: Any) -> Any:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


class Cluster(_Topology):
    """A Redis Cluster of ``masters`` primaries (and replicas added with :meth:`add_replica`)."""

    def __init__(self, folder: Path, *, full_coverage: bool = True) -> None:
        super().__init__(folder)
        self.full_coverage = full_coverage

    @classmethod
    def start(cls, folder: Path, masters: int = 3, *, full_coverage: bool = True) -> Cluster:
        """A cluster of ``masters`` primaries; ``full_coverage=False``: the nodes keep serving their own
        slots while another's are down (``cluster-require-full-coverage no``)."""
        cluster = cls(folder, full_coverage=full_coverage)
        try:
            for number in range(masters):
                cluster._node(f"node{number}")
            cluster.wait_until(lambda: all(s.answers() for s in cluster.servers), "every node to answer")
            created = subprocess.run(
                [
                    "redis-cli",
                    "--cluster",
                    "create",
                    *cluster.addresses(),
                    "--cluster-replicas",
                    "0",
                    "--cluster-yes",
                ],
                capture_output=True,
                text=True,
                timeout=BOUND,
                check=False,
            )
            if created.returncode != 0:
                raise TopologyError(f"redis-cli --cluster create failed:\n{created.stdout}\n{created.stderr}")
            cluster.wait_until(
                cluster.converged, "every node to report cluster_state:ok and the full slot map"
            )
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _node(self, name: str) -> RedisServer:
        bus = free_port()
        server = _data_node(
            name,
            self.folder,
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            # The cluster bus on a free port of its own (its default, port + 10000, may be taken or
            # above 65535).
            "--cluster-port",
            str(bus),
            "--cluster-node-timeout",
            "2000",
            # A replica takes over at once (no wait scaled by its data age), and a node that comes back
            # from a crash rejoins as it was: the tests decide when a node fails, not the clock.
            "--cluster-replica-validity-factor",
            "0",
            "--cluster-require-full-coverage",
            "yes" if self.full_coverage else "no",
        )
        server.config += ["--dir", str(server.folder)]
        server.bus_port = bus
        self.servers.append(server.start())
        return server

    def addresses(self, servers: Sequence[RedisServer] | None = None) -> list[str]:
        return [f"127.0.0.1:{server.port}" for server in (servers or self.servers)]

    def url(
        self, prefix: str | None = None, *, scheme: str = "redis+cluster", nodes: int = 2, **options: Any
    ) -> str:
        """A ``redis+cluster://`` URL naming the first ``nodes`` nodes, with ``prefix`` and ``options``."""
        query = {**({"prefix": prefix} if prefix else {}), **options}
        text = "&".join(f"{name}={value}" for name, value in query.items())
        return f"{scheme}://{','.join(self.addresses()[:nodes])}/" + (f"?{text}" if text else "")

    def node(self, port: int) -> RedisServer:
        return next(server for server in self.servers if server.port == port)

    def converged(self) -> bool:
        """Every running node says the cluster is ``ok``, knows every other, and agrees on who serves
        every slot."""
        running = [server for server in self.servers if server.alive()]
        if len(running) < len(self.servers):
            return False
        maps = []
        for server in running:
            with contextlib.closing(server.client()) as client:
                info = client.execute_command("CLUSTER INFO")
                if info.get("cluster_state") != "ok" or int(info.get("cluster_known_nodes", 0)) < len(
                    running
                ):
                    return False
                slots = client.execute_command("CLUSTER SLOTS")
                maps.append(sorted((int(s[0]), int(s[1]), int(s[2][1])) for s in slots))
        return all(each == maps[0] for each in maps) and sum(b - a + 1 for a, b, _ in maps[0]) == 16384

    def master_of(self, key: str) -> RedisServer:
        """The node serving ``key`` now (asked of the cluster, not computed)."""
        running = next(server for server in self.servers if server.alive())
        with contextlib.closing(running.client()) as client:
            slot = int(client.execute_command("CLUSTER KEYSLOT", key))
            for start, end, master, *_ in client.execute_command("CLUSTER SLOTS"):
                if int(start) <= slot <= int(end):
                    return self.node(int(master[1]))
        raise TopologyError(f"no node serves the slot of {key!r}")

    def add_replica(self, master: RedisServer) -> RedisServer:
        """A new node, joined as a replica of ``master``, once its link is up."""
        replica = self._node(f"node{len(self.servers)}")
        self.wait_until(replica.answers, f"{replica.name} to answer")
        with contextlib.closing(master.client()) as client:
            master_id = client.execute_command("CLUSTER MYID").decode()
        with contextlib.closing(replica.client()) as client:
            client.execute_command("CLUSTER MEET", "127.0.0.1", master.port, master.bus_port)
            self.wait_until(
                lambda: any(
                    node.get("node_id") == master_id
                    for node in client.execute_command("CLUSTER NODES").values()
                ),
                f"{replica.name} to know {master.name}",
            )
            client.execute_command("CLUSTER REPLICATE", master_id)
            self.wait_until(
                lambda: client.info("replication").get("master_link_status") == "up",
                f"{replica.name} to replicate {master.name}",
            )
        self.wait_until(self.converged, "the cluster to take in the replica")
        return replica

    def move_slot(self, slot: int, target: RedisServer) -> None:
        """Move one slot, with its keys, to ``target`` (a resharding, as ``redis-cli --cluster
        reshard`` does it: IMPORTING/MIGRATING, MIGRATE of each key, then SETSLOT NODE everywhere)."""
        with self.migrating(slot, target):
            pass

    @contextlib.contextmanager
    def migrating(self, slot: int, target: RedisServer) -> Iterator[None]:
        """``slot`` half-moved to ``target`` inside the block (its old node answers ``ASK`` for a key
        it no longer has), and moved with all its keys at the end."""
        with contextlib.closing(self.servers[0].client()) as any_node:
            owner_port = next(
                int(master[1])
                for start, end, master, *_ in any_node.execute_command("CLUSTER SLOTS")
                if int(start) <= slot <= int(end)
            )
        source = self.node(owner_port)
        if source is target:
            yield
            return
        with contextlib.closing(source.client()) as src, contextlib.closing(target.client()) as dst:
            source_id = src.execute_command("CLUSTER MYID").decode()
            target_id = dst.execute_command("CLUSTER MYID").decode()
            dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source_id)
            src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target_id)
            yield
            while keys := src.execute_command("CLUSTER GETKEYSINSLOT", slot, 100):
                src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 10_000, "KEYS", *keys)
            for server in self.servers:  # the masters (a replica refuses it, and learns it from them)
                if server.alive():
                    with contextlib.closing(server.client()) as client:
                        if client.info("replication").get("role") == "master":
                            client.execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)
        self.wait_until(self.converged, f"every node to agree that slot {slot} moved")


class SentinelSet(_Topology):
    """A master, ``replicas`` replicas and ``sentinels`` Sentinels (quorum: a majority) on loopback."""

    master: RedisServer
    replicas: list[RedisServer]
    sentinels: list[RedisServer]

    @classmethod
    def start(
        cls, folder: Path, replicas: int = 1, sentinels: int = 3, *, sentinel_password: str | None = None
    ) -> SentinelSet:
        """The set; ``sentinel_password``: the Sentinels ask clients for it (``requirepass``), and for
        one another's (``sentinel sentinel-pass``)."""
        group = cls(folder)
        try:
            group.master = _data_node("master", folder).start()
            group.servers.append(group.master)
            group.wait_until(group.master.answers, "the master to answer")
            group.replicas = []
            for number in range(replicas):
                replica = _data_node(
                    f"replica{number}", folder, "--replicaof", "127.0.0.1", str(group.master.port)
                )
                group.replicas.append(replica.start())
                group.servers.append(replica)
            group.wait_until(group._replicas_linked, "every replica's link to the master")
            group.wait_until(group.replicas_caught_up, "every replica to acknowledge the master's writes")
            group.sentinels = []
            # Each Sentinel is told the others and the replicas (what it would otherwise learn from
            # their hello messages, every 2 s): the set is ready as soon as they are connected.
            ids = [uuid.uuid4().hex + uuid.uuid4().hex[:8] for _ in range(sentinels)]
            ports = [free_port() for _ in range(sentinels)]
            for number, port in enumerate(ports):
                config = [
                    f"port {port}",
                    "bind 127.0.0.1",
                    f"dir {folder / f'sentinel{number}'}",
                    f"sentinel myid {ids[number]}",
                    f"sentinel monitor {SERVICE} 127.0.0.1 {group.master.port} {sentinels // 2 + 1}",
                    f"sentinel down-after-milliseconds {SERVICE} 1000",
                    f"sentinel failover-timeout {SERVICE} 10000",
                    f"sentinel parallel-syncs {SERVICE} 1",
                ]
                if sentinel_password is not None:
                    config += [
                        f"requirepass {sentinel_password}",
                        f"sentinel sentinel-pass {sentinel_password}",
                    ]
                config += [
                    f"sentinel known-sentinel {SERVICE} 127.0.0.1 {other} {ids[index]}"
                    for index, other in enumerate(ports)
                    if index != number
                ]
                config += [f"sentinel known-replica {SERVICE} 127.0.0.1 {r.port}" for r in group.replicas]
                sentinel = RedisServer(
                    f"sentinel{number}", folder / f"sentinel{number}", port, config, sentinel=True
                )
                sentinel.password = sentinel_password
                group.sentinels.append(sentinel.start())
                group.servers.append(sentinel)
            group.wait_until(
                lambda: group.agreed(group.master, replicas=replicas), "every Sentinel to see the set"
            )
        except BaseException:
            group.stop()
            raise
        return group

    def url(
        self,
        prefix: str | None = None,
        *,
        scheme: str = "redis+sentinel",
        also: Sequence[int] = (),
        **options: Any,
    ) -> str:
        """A ``redis+sentinel://`` URL naming every Sentinel (after the ports in ``also``)."""
        query = {"service_name": SERVICE, **({"prefix": prefix} if prefix else {}), **options}
        text = "&".join(f"{name}={value}" for name, value in query.items())
        nodes = ",".join(f"127.0.0.1:{port}" for port in [*also, *(s.port for s in self.sentinels)])
        return f"{scheme}://{nodes}/0?{text}"

    def _replicas_linked(self) -> bool:
        for replica in self.replicas:
            with contextlib.closing(replica.client()) as client:
                info = client.info("replication")
                if (
                    info.get("master_link_status") != "up"
                    or int(info.get("master_port", 0)) != self.master.port
                ):
                    return False
        return True

    def replicas_caught_up(self) -> bool:
        """Every replica has acknowledged all the master's writes so far (``WAIT``). A replica whose
        link just came up may not have sent its first acknowledgement: a ``WAIT`` with a short timeout
        (``min_replicas``) then counted 0 replicas; and a failover promotes a replica as it is, so
        writes it had not received were lost (a test of a failover, not of replication lag, waits)."""
        if not self.replicas:
            return True
        with contextlib.closing(self.master.client()) as client:
            pipe = client.pipeline(transaction=False)  # one connection: WAIT counts its own writes
            pipe.publish("dibs-test:caught-up", "?")
            pipe.execute_command("WAIT", len(self.replicas), 500)
            return int(pipe.execute()[-1]) >= len(self.replicas)

    def agreed(self, master: RedisServer, *, replicas: int | None = None) -> bool:
        """Every Sentinel names ``master`` (and, if given, knows ``replicas`` replicas up)."""
        for sentinel in self.sentinels:
            if not sentinel.alive():
                continue
            with contextlib.closing(sentinel.client()) as client:
                address = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
                if address is None or int(address[1]) != master.port:
                    return False
                if replicas is not None:
                    # A replica it can promote: seen as a replica (its INFO read), its link to the
                    # master up; and every other Sentinel known (a vote needs them).
                    known = [_fields(r) for r in client.execute_command("SENTINEL", "REPLICAS", SERVICE)]
                    ready = [
                        r for r in known if r.get("flags") == "slave" and r.get("master-link-status") == "ok"
                    ]
                    others = _fields(client.execute_command("SENTINEL", "MASTER", SERVICE))
                    if (
                        len(ready) < replicas
                        or int(others.get("num-other-sentinels", 0)) < len(self.sentinels) - 1
                    ):
                        return False
        return True

    def current_master(self) -> RedisServer:
        """The data node that is a master now (by its own ``role``)."""
        for server in [self.master, *self.replicas]:
            if server.alive():
                with contextlib.closing(server.client()) as client:
                    if client.info("replication").get("role") == "master":
                        return server
        raise TopologyError("no data node is a master")

    def failover(self, *, natural: bool = False, convert: bool = True) -> RedisServer:
        """``SENTINEL FAILOVER`` on one Sentinel; returns the new master once every Sentinel names it and
        every other data node replicates it again.

        The Sentinels promote a replica within about a second, but turn the old master into a replica
        only when they next look at it, 8 to 10 s later: until then it still takes writes from the
        clients connected to it (a split brain, which ``min_replicas`` guards against). Unless
        ``natural``, this does at once what they would do then (``REPLICAOF`` the new master, then
        ``CLIENT KILL`` its clients, so that they ask the Sentinels again), so a failover costs a test
        one or two seconds instead of ten or more. ``convert=False`` returns in the split brain: the new
        master promoted and named by every Sentinel, the old one still a master, until
        :meth:`convert` (a test acts within those 8 s; the Sentinels wait that long by design)."""
        old, candidates = self.master, list(self.replicas)
        # A Sentinel promotes only a replica it has read lately (INFO, every 10 s): right after an
        # earlier failover that can take a while.
        self.wait_until(
            lambda: self.agreed(old, replicas=len(candidates)), "a replica the Sentinels may promote"
        )
        self.wait_until(self.replicas_caught_up, "every replica to have the master's writes")
        sentinel = next(s for s in self.sentinels if s.alive())
        with contextlib.closing(sentinel.client()) as client:
            client.execute_command("SENTINEL", "FAILOVER", SERVICE)
        new = self.wait_until(lambda: self._promoted(candidates), "a replica to become master")
        self.wait_until(lambda: self.agreed(new), "every Sentinel to name the new master")
        self.master, self.replicas = new, [s for s in [old, *self.replicas] if s is not new]
        if convert:
            self.convert(natural=natural)
        return new

    def convert(self, *, natural: bool = False) -> None:
        """Make every data node but the master its replica again, as the Sentinels do after a failover
        (``REPLICAOF`` it, then ``CLIENT KILL`` the node's clients: sentinelSendSlaveOf), or, if
        ``natural``, wait until they have."""
        if not natural:
            for server in self.replicas:
                with contextlib.closing(server.client()) as client:
                    client.execute_command("REPLICAOF", "127.0.0.1", self.master.port)
                    client.execute_command("CLIENT", "KILL", "TYPE", "normal")
                    client.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
        self.wait_until(self._replicas_linked, "every other node to replicate the new master")
        self.wait_until(self.replicas_caught_up, "every replica to acknowledge the new master's writes")

    def _promoted(self, candidates: Sequence[RedisServer]) -> RedisServer | None:
        for server in candidates:
            with contextlib.closing(server.client()) as client:
                if client.info("replication").get("role") == "master":
                    return server
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _fields(flat: Any) -> dict[str, str]:
    """A Sentinel's reply about one server (a dict, or a flat list of names and values) as text."""
    if isinstance(flat, dict):
        return {_text(k): _text(v) for k, v in flat.items()}
    items = [_text(item) for item in flat]
    return dict(zip(items[::2], items[1::2], strict=False))


def delete_prefix(clients: Sequence[Any], prefix: str) -> None:
    """Delete every key under ``prefix`` on each of ``clients`` that is a master (a test's own keys,
    nothing else; a replica loses them with its master's)."""
    for client in clients:
        if client.info("replication").get("role") != "master":
            continue
        doomed = list(client.scan_iter(match=f"{prefix}*", count=500))
        for start in range(0, len(doomed), 500):
            for key in doomed[start : start + 500]:
                client.delete(key)  # one by one: a cluster node refuses keys of several slots at once


_SHARED: dict[str, tuple[Any, Path]] = {}


def _shared(name: str, make: Callable[[Path], _Topology]) -> Any:
    if name not in _SHARED:
        folder = Path(tempfile.mkdtemp(prefix=f"dibs-{name}-"))
        _SHARED[name] = (make(folder), folder)
    return _SHARED[name][0]


@atexit.register
def stop_shared() -> None:
    """Stop the shared topologies (at the end of a pytest session, in each xdist worker, whose exit
    runs no ``atexit`` hook; else at the interpreter's exit)."""
    while _SHARED:
        topology, folder = _SHARED.popitem()[1]
        topology.stop()
        shutil.rmtree(folder, ignore_errors=True)


def pytest_sessionfinish() -> None:
    """This module is a pytest plugin (the root ``conftest.py``) for this hook alone."""
    stop_shared()


def shared_cluster() -> Cluster:
    """One 3-master cluster per test process, started at its first use and stopped at exit. Tests
    that use it must not break it (they take a prefix of their own: :func:`unique_prefix`)."""
    return _shared("cluster", Cluster.start)


def shared_sentinels() -> SentinelSet:
    """One Sentinel set (a master, a replica, three Sentinels) per test process, as above."""
    return _shared("sentinels", SentinelSet.start)


def unique_prefix() -> str:
    return f"dibs-test-{uuid.uuid4().hex}:"


@contextlib.contextmanager
def temporary(folder: Path, make: Callable[[Path], T]) -> Iterator[T]:
    """A topology of a test's own (one it may break), stopped at the end whatever happened."""
    topology: Any = make(folder)
    try:
        yield topology
    finally:
        topology.stop()
