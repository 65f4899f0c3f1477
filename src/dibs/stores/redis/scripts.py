"""The Redis store's Lua scripts: package data (``lua/*.lua``), put together and registered here.

Each script Redis runs is three parts, in this order:

1. constants generated from Python: the record's hash fields (the shared decoder's names, in the
   order the scripts return them, and the shorter lists of the replies to a granted lease and a
   completed key), which of them are integers, counters, times or non-empty text,
   and the limits of :mod:`dibs.records`; so the Lua side cannot drift from the decoder;
2. ``lua/prelude.lua``, shared by every script: the functions (load and check a record, compare
   fences, keep the indexes, build the reply), then the shared parts the script names in
   :data:`PARTS` (``lua/dropping.lua``: the removal rules, one record at a time, for both ``drop``
   and ``drop_many``, so the rules are written once), then ``lua/guard.lua``, the guard every script
   but ``drop_many`` starts with, written once: read the server's clock, load the key's record (a
   foreign or damaged value answers ``{'corrupt', why}`` before anything is written) and, in a script
   that acts under a lease (:data:`UNDER_LEASE`), answer ``lost`` unless the caller's token is the
   current one. ``drop_many`` loads and judges many records, each with the same ``load_record``;
3. the script's own body, ``lua/NAME.lua``, whose header comment gives its KEYS, ARGV and reply.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import re
from collections.abc import Callable, Sequence
from typing import Any, cast

import redis
import redis.exceptions
from redis.cluster import RedisCluster
from redis.commands.core import Script as RedisScript

from dibs.records import MAX_COUNT, MAX_FENCE, MAX_TIMESTAMP
from dibs.stores import decoder

__all__ = [
    "COMPLETED_FIELDS",
    "FIELDS",
    "FORMAT",
    "GRANTED_FIELDS",
    "PARTS",
    "PRESENT_FIELDS",
    "UNDER_LEASE",
    "UNGUARDED",
    "WRITERS",
    "Reply",
    "Script",
    "Scripts",
    "source",
]

FORMAT = "dibs.redis/1"

#: What a script returns: ``{status, now, extra, FIELDS...[, payload]}`` or ``{"corrupt", why}``.
Reply = list[Any]

# The hash fields of a record are the shared decoder's names, in the order the scripts return them.
FIELDS = decoder.FIELDS
#: What a ``granted`` reply of acquire carries after ``{status, now, took_over_from}``: the fields of the
#: new lease's record that the caller does not know already (it sent the owner, lease id and ttl; the
#: lease's fence and attempt are the record's, its start is ``now``), then, only when the record holds
#: one, the failure it reports (``decoder.FAILURE_FIELDS``: issue 20, four nils less to send and read
#: in the usual grant). No artifact field: the state built from it carries no stale artifact beside the
#: lease (nothing reads one).
GRANTED_FIELDS = ("fence", "attempts", "lease_expires_at", "lease_max_expires_at")
#: What a ``present`` reply of acquire carries after ``{status, now, false}``, before the payload: the
#: record's counters and its artifact, all a caller finding the artifact needs (the key's identity and
#: format were checked by the script; no lease or failure: the hit reports neither). Issue 20: every
#: process losing a race reads this reply, so its 24 fields were a good part of a hit's cost.
PRESENT_FIELDS = ("fence", "attempts", *decoder.ARTIFACT_FIELDS, "artifact_compute_seconds")
#: What an ``ok`` reply of complete carries after ``{status, now, false}``: the fields of the stored
#: artifact the caller does not know (it sent serializer, payload and checksum; the fence is its token's;
#: its ``artifact_created_at`` is the reply's ``now``, the same text). No failure field: the state built
#: from it carries none (only its artifact is returned).
COMPLETED_FIELDS = ("attempts", "artifact_producer", "artifact_compute_seconds")
# Integers up to a signed 64-bit one (the most HINCRBY can hold), and counters up to a 32-bit one.
_WIDE_INTEGERS = ("fence", "lease_fence", "artifact_size", "artifact_fence")
_COUNTERS = ("attempts", "lease_attempt", "failure_count")
# Text that must not be empty when present (as the decoder requires).
_NONEMPTY = (
    "lease_owner",
    "lease_id",
    "failure_owner",
    "artifact_serializer",
    "artifact_checksum",
    "artifact_producer",
)
_SECONDS = (
    "lease_acquired_at",
    "lease_expires_at",
    "lease_ttl",
    "lease_max_expires_at",
    "failure_at",
    "artifact_created_at",
    "artifact_compute_seconds",
)

#: Every script by name, and whether it acts under the caller's lease (ARGV[3] its fence, ARGV[4] its
#: id): the prelude's guard then answers ``lost`` for a token that is not the current one.
UNDER_LEASE = {
    "acquire": False,
    "heartbeat": True,
    "complete": True,
    "release": True,
    "drop": False,
    "drop_many": False,
    "read": False,
    "reindex": False,
}
#: The shared parts (``lua/NAME.lua``) a script takes between the prelude and the guard.
PARTS: dict[str, tuple[str, ...]] = {"drop": ("dropping",), "drop_many": ("dropping",)}
#: The scripts that start without the guard: they load their records themselves.
UNGUARDED = frozenset({"drop_many"})
#: The scripts that write a record, and so keep its namespace's indexes (KEYS[2..]) when the store
#: has them (:mod:`dibs.stores.redis.index`); the read script is given the record's key alone.
WRITERS = frozenset({"acquire", "heartbeat", "complete", "release", "drop", "drop_many", "reindex"})


def _lua_list(names: Sequence[str]) -> str:
    return "{" + ", ".join(f"'{name}'" for name in names) + "}"


def _lua_set(names: Sequence[str], value: str) -> str:
    """A Lua table literal mapping each name to ``value`` (a lookup the script builds in one step)."""
    return "{" + ", ".join(f"{name} = {value}" for name in names) + "}"


def _constants(text: str, under_lease: bool) -> str:
    """The ``local`` declarations ``text`` (the prelude and one body) reads, generated from Python's own
    tuples and limits.

    Redis runs a script's top level on every call, so every table declared here is built again each
    time: the lookups are written out as literals (no loop building them), and a script gets only
    the constants it names (issue 20: the per-call set-up was a third of a script's server time).
    """
    values = {
        "FORMAT": f"'{FORMAT}'",
        "FIELDS": _lua_list(FIELDS),
        "GROUPS": "{"
        + ", ".join(
            f"{group} = {_lua_list(names)}"
            for group, names in (
                ("lease", decoder.LEASE_FIELDS),
                ("failure", decoder.FAILURE_FIELDS),
                ("artifact", decoder.ARTIFACT_FIELDS),
            )
        )
        + "}",
        "MAX_FENCE": f"'{MAX_FENCE}'",
        "MAX_COUNT": f"'{MAX_COUNT}'",
        "MAX_TIME": repr(MAX_TIMESTAMP),
        # Integer fields and the largest decimal each may hold.
        "LIMITS": "{"
        + ", ".join(
            [f"{name} = '{MAX_FENCE}'" for name in _WIDE_INTEGERS]
            + [f"{name} = '{MAX_COUNT}'" for name in _COUNTERS]
        )
        + "}",
        "SECONDS": _lua_set(_SECONDS, "true"),
        "NONEMPTY": _lua_set(_NONEMPTY, "true"),
        "GRANTED_FIELDS": _lua_list(GRANTED_FIELDS),
        "COMPLETED_FIELDS": _lua_list(COMPLETED_FIELDS),
        "PRESENT_FIELDS": _lua_list(PRESENT_FIELDS),
        "UNDER_LEASE": "true" if under_lease else "false",
        # What a tombstone no longer holds: the lease, the artifact (its payload apart) and the failure.
        "CLEARED": _lua_list(
            (
                "lease_max_expires_at",
                *decoder.LEASE_FIELDS,
                "artifact_compute_seconds",
                *decoder.ARTIFACT_FIELDS,
                *decoder.FAILURE_FIELDS,
            )
        ),
    }
    return "".join(
        f"local {name} = {value}\n" for name, value in values.items() if re.search(rf"\b{name}\b", text)
    )


def _package_text(name: str) -> str:
    return (importlib.resources.files(__package__ or "") / "lua" / f"{name}.lua").read_text(encoding="utf-8")


@functools.cache
def source(name: str) -> str:
    """The whole text of script ``name`` as Redis runs it: constants, prelude, shared parts, guard,
    body."""
    parts = ("prelude", *PARTS.get(name, ()), *(() if name in UNGUARDED else ("guard",)), name)
    text = "".join(_package_text(part) for part in parts)
    return _constants(text, UNDER_LEASE[name]) + text


@dataclasses.dataclass(frozen=True)
class Script:
    """One script, run by its SHA (``EVALSHA``) through a client's ``execute_command``.

    Not redis-py's ``Script.__call__``: that builds the argument tuple again, imports ``Pipeline`` and
    goes through three more calls on every run (issue 20: with the store's ``try`` in place of a
    context manager, client CPU per reserve + complete 128 → 113 µs, measured). What
    it does on ``NOSCRIPT`` is kept: the server had lost the script (a restart, a failover, ``SCRIPT
    FLUSH``), so it did not run; it is loaded and run again, once. Pipelines (``list``, ``read_many``)
    take :attr:`registered`, redis-py's own, which loads missing scripts before the pipeline runs.

    The client is given at each run, not kept: a cluster's client is built at the store's first
    operation, and a run that must stay on one connection (``min_replicas``) sends through one.
    """

    registered: RedisScript

    @property
    def sha(self) -> str:
        return str(self.registered.sha)

    def __call__(
        self, client: Any, record_key: str | bytes, *args: str | bytes | int, more: Sequence[str] = ()
    ) -> Reply:
        """The script's reply, run by ``client`` on ``record_key`` (its first key; ``more``: the index
        keys that follow it, see :mod:`dibs.stores.redis.index`) with ``args`` (its ARGV)."""
        run: Callable[..., Any] = client.execute_command  # untyped in redis-py
        sha = self.registered.sha
        try:
            return cast(Reply, run("EVALSHA", sha, 1 + len(more), record_key, *more, *args))
        except redis.exceptions.NoScriptError:
            # Not run: the server does not know the script. Load it and run it again; a second
            # NOSCRIPT (a proxy spreading commands over servers) is the caller's error, not a loop.
            if isinstance(client, RedisCluster):
                _load_on_primaries(client, self.registered.script)
            else:
                client.script_load(self.registered.script)
            return cast(Reply, run("EVALSHA", sha, 1 + len(more), record_key, *more, *args))

    def queue(
        self, pipe: Any, record_key: str | bytes, *args: str | bytes | int, more: Sequence[str] = ()
    ) -> None:
        """Add a run to ``pipe`` (one node's pipeline), which loads the script first if it must."""
        self.registered(keys=[record_key, *more], args=list(args), client=pipe)


def _load_on_primaries(cluster: RedisCluster, text: Any) -> None:
    """Load a script on every primary of a cluster that answers: the one that said ``NOSCRIPT`` may
    not be the key's node in the client's map (an ``ASK`` during a resharding sends the script to
    the slot's new node). Not redis-py's ``script_load``, which fails whole when one primary is down,
    though the script runs elsewhere; a node that failed here fails the script's own run, if it is
    the one that must run it."""
    run: Callable[..., Any] = cluster.execute_command
    for node in cluster.get_primaries():  # type: ignore[no-untyped-call]
        try:
            run("SCRIPT LOAD", text, target_nodes=node)
        except redis.exceptions.RedisError:
            continue


@dataclasses.dataclass(frozen=True)
class Scripts:
    """Every script of the store (loaded on a server at its first run there)."""

    acquire: Script
    heartbeat: Script
    complete: Script
    release: Script
    drop: Script
    drop_many: Script
    read: Script
    reindex: Script

    @classmethod
    def load(cls) -> Scripts:
        # The text as bytes: redis-py then needs no client to take its SHA (it would ask one for its
        # encoder), and a cluster's client does not exist before the first operation.
        return cls(
            **{name: Script(RedisScript(cast(Any, None), source(name).encode())) for name in UNDER_LEASE}
        )
