"""Keys as people type them: a readable name stands for the keys it names.

A derived key reads ``name[@version]/<digest>`` (:func:`dibs.derive_key`), and nobody retypes a
16-digit digest. So wherever the command takes a key it also takes the readable part: ``slow_compute``
names every key of that function (every version, every set of arguments), ``slow_compute@2`` those
of one version, ``slow_compute/0140`` those whose digest starts so, and a pattern with ``*``, ``?``
or ``[`` is a shell-style glob over the whole name. ``ls`` lists what a pattern names; ``show``,
``release`` and ``forget`` act on the one key it names, and refuse (listing the candidates) when it
names several, because repairing the wrong key is worse than asking for more of the digest.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable

from dibs.client import Reservations
from dibs.display import printable
from dibs.errors import ConfigurationError
from dibs.keys import Key
from dibs.records import KeyState

__all__ = ["matches", "resolve", "select"]

#: How many candidates an ambiguous name lists before it says how many more there are.
_SHOWN = 10


def matches(name: str, pattern: str) -> bool:
    """Whether the key ``name`` is one that ``pattern`` names (see the module's docstring)."""
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatchcase(name, pattern)
    if name == pattern:
        return True
    if "/" in pattern:  # a name and the start of a digest
        return name.startswith(pattern)
    return name.startswith((pattern + "/", pattern + "@"))


def resolve(client: Reservations, pattern: str, wanted: str) -> Key:
    """The one key ``pattern`` names in the client's namespace: the key itself if the store has a
    record of that exact name, else the single record whose name it matches. ``wanted`` says what the
    command acts on (``"a key to forget"``), for the error when there are several or none."""
    exact = client.key(pattern)
    if client.status(exact).fence:  # a record of that very name: the key, whatever else it matches
        return exact
    found = sorted(s.key.name for s in client.list() if matches(s.key.name, pattern))
    if len(found) == 1:
        return client.key(found[0])
    if not found:
        return exact  # the command reports "nothing there" for the name as typed
    raise ConfigurationError(
        f"{printable(pattern)!r} names {len(found)} keys in namespace {client.namespace!r}, and "
        f"{wanted} must be one: {_listed(found)}; give more of it (e.g. the start of the digest after "
        "'/'), or the whole key as 'dibs ls' shows it"
    )


def select(states: Iterable[KeyState], pattern: str | None) -> list[KeyState]:
    """The states whose key ``pattern`` names (all of them without one)."""
    return [s for s in states if pattern is None or matches(s.key.name, pattern)]


def _listed(names: list[str]) -> str:
    shown = ", ".join(printable(n) for n in names[:_SHOWN])
    return shown if len(names) <= _SHOWN else f"{shown} and {len(names) - _SHOWN} more"
