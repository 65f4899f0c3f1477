"""``min_replicas``: a grant or a complete is returned only once that many replicas have it.

Redis replicates asynchronously: a master confirms a write before any replica has it, and a replica
promoted by a failover (Sentinel, a cluster's own) starts from what it had received. Without this
option a lease granted just before a failover can be forgotten, and its token granted again to
someone else (the same fence, a second holder), and an artifact stored just before it lost (the key
computed again). ``WAIT n timeout``, sent on the connection that ran the script, blocks until ``n``
replicas acknowledged everything that connection wrote, or the timeout passes; it is answered with
the number that did.

The script and its ``WAIT`` must go over one connection (``WAIT`` counts only its own connection's
writes), so this runs them on a connection taken from the pool of the node that serves the key, not
through the client's ``execute_command``. What to do when fewer replicas confirm is the store's
decision (:class:`Unreplicated` carries the reply): see :mod:`dibs.stores.redis`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import redis
import redis.exceptions

from dibs.stores.redis.scripts import Reply, Script
from dibs.stores.redis.topology import Reach

__all__ = ["ReplicaWait", "Unreplicated"]


class Unreplicated(Exception):
    """The script ran and wrote, but fewer than the replicas asked for confirmed it in time."""

    def __init__(self, reply: Reply, acknowledged: int) -> None:
        super().__init__(f"{acknowledged} replica(s) confirmed the write")
        self.reply = reply
        self.acknowledged = acknowledged


class ReplicaWait:
    """Runs a script, then ``WAIT replicas timeout`` on the same connection when the reply says it wrote
    something the caller will rely on (``confirm``)."""

    def __init__(self, replicas: int, timeout: float, reach: Reach) -> None:
        self.replicas = replicas
        self.timeout = timeout
        self._milliseconds = max(1, round(timeout * 1000))
        self._reach = reach

    def run(
        self,
        script: Script,
        record_key: str,
        args: Sequence[str | bytes | int],
        confirm: Callable[[Reply], bool],
        more: Sequence[str] = (),
    ) -> Reply:
        """``script``'s reply, confirmed by the replicas when ``confirm(reply)``; :class:`Unreplicated`
        when they did not confirm it in time."""
        for attempt in range(2):
            node = self._reach.node_of(record_key)
            try:
                return self._on_one_connection(node, script, record_key, args, confirm, more=more)
            except redis.exceptions.AskError:  # MOVED or ASK: the slot moves, and the script did not run
                if attempt:
                    raise
                self._reach.refresh()
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                # Past the client's own routing, nothing else tells it: a cluster reads its slot map
                # again (a replica may have taken over), a Sentinel pool drops its idle connections.
                self._reach.refresh()
                raise
        raise AssertionError("unreachable")

    def confirm(self, record_key: str, channel: str) -> int:
        """How many replicas have every write the master made so far (the key's node on a cluster):
        a ``PUBLISH`` on ``channel`` (replicated, and harmless: a waiter that hears it reads the key
        once), then ``WAIT`` on the same connection, which waits for the offset of that publish."""
        node: Any = self._reach.node_of(record_key)
        pool = node.connection_pool
        connection: Any = pool.get_connection()
        try:
            connection.send_command("PUBLISH", channel, "confirm")
            node.parse_response(connection, "PUBLISH")
            connection.send_command("WAIT", self.replicas, self._milliseconds)
            return int(node.parse_response(connection, "WAIT"))
        except redis.exceptions.ResponseError:
            raise
        except BaseException:
            connection.disconnect()
            raise
        finally:
            pool.release(connection)

    def _on_one_connection(
        self,
        node: Any,
        script: Script,
        record_key: str,
        args: Sequence[str | bytes | int],
        confirm: Callable[[Reply], bool],
        *,
        more: Sequence[str],
    ) -> Reply:
        """The script and its ``WAIT`` on one connection of ``node``'s pool (a ``redis.Redis``, whose
        ``parse_response`` reads each reply as its ``execute_command`` would)."""
        pool = node.connection_pool
        connection: Any = pool.get_connection()
        try:
            reply = _evalsha(node, connection, script, record_key, args, more=more)
            if not confirm(reply):
                return reply
            connection.send_command("WAIT", self.replicas, self._milliseconds)
            acknowledged = int(node.parse_response(connection, "WAIT"))
        except redis.exceptions.ResponseError:
            raise  # an error reply: the connection is still in step with the server
        except BaseException:
            # A lost or cut reply leaves the connection out of step: drop it (as redis-py's client does).
            connection.disconnect()
            raise
        finally:
            pool.release(connection)
        if acknowledged < self.replicas:
            raise Unreplicated(reply, acknowledged)
        return reply


def _evalsha(
    node: Any,
    connection: Any,
    script: Script,
    record_key: str,
    args: Sequence[str | bytes | int],
    *,
    more: Sequence[str],
) -> Reply:
    """The script run on ``connection``, loaded there first if the server does not know it
    (``NOSCRIPT``: it did not run), as :class:`~dibs.stores.redis.scripts.Script` does."""
    connection.send_command("EVALSHA", script.sha, 1 + len(more), record_key, *more, *args)
    try:
        return list(node.parse_response(connection, "EVALSHA"))
    except redis.exceptions.NoScriptError:
        connection.send_command("SCRIPT", "LOAD", script.registered.script)
        node.parse_response(connection, "SCRIPT LOAD")
        connection.send_command("EVALSHA", script.sha, 1 + len(more), record_key, *more, *args)
        return list(node.parse_response(connection, "EVALSHA"))
