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
from dibs.stores import pages

__all__ = ["FIRST_PAGE", "lookup", "matches", "past", "prefix", "resolve", "select", "start"]

#: How many candidates an ambiguous name lists before it says how many more there are.
_SHOWN = 10
#: The first page of a lookup: most names name one key. Each further page is twice the last, up to
#: :data:`dibs.stores.pages.PAGE`, so a lookup reads at most about twice what it matches (plus this).
FIRST_PAGE = 16
#: The last code point: a cursor name ending with it comes after every name that does not begin with it.
_LAST = "\U0010ffff"


def matches(name: str, pattern: str) -> bool:
    """Whether the key ``name`` is one that ``pattern`` names (see the module's docstring)."""
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatchcase(name, pattern)
    if name == pattern:
        return True
    if "/" in pattern:  # a name and the start of a digest
        return name.startswith(pattern)
    return name.startswith((pattern + "/", pattern + "@"))


def prefix(pattern: str) -> str:
    """What every name ``pattern`` names starts with: the pattern, or a glob's part before its first
    ``*``, ``?`` or ``[``."""
    for i, c in enumerate(pattern):
        if c in "*?[":
            return pattern[:i]
    return pattern


def start(namespace: str, pattern: str) -> str | None:
    """A listing cursor of ``namespace`` just before the first name that could start with ``pattern``'s
    prefix (``None``: from the namespace's first key). The greatest name below a prefix has no end
    (``slow_computd`` followed by ever more of the last code point), so the cursor is that name with
    one last code point (U+10FFFF): only a name holding that code point could fall in between, and a
    key's name is printable (:func:`dibs.keys.validate_name`), which U+10FFFF is not."""
    first = prefix(pattern)
    if not first:
        return None
    below = ""
    if first[-1] > "\x00":
        code = ord(first[-1]) - 1
        below = chr(0xD7FF if 0xD800 <= code <= 0xDFFF else code) + _LAST  # never half a surrogate pair
    return pages.cursor_after(namespace, first[:-1] + below)


def past(name: str, pattern: str) -> bool:
    """Whether ``name``, met in key order from :func:`start`, comes after every name ``pattern``
    names: it no longer starts with the prefix, and is above it."""
    first = prefix(pattern)
    return not name.startswith(first) and name > first


def lookup(client: Reservations, pattern: str) -> list[str]:
    """The names of the client's namespace that ``pattern`` names, in key order, read by pages from
    :func:`start` until :func:`past` (see the module)."""
    namespace = client.namespace
    found: list[str] = []
    after = start(namespace, pattern)
    for page in client.store.list_pages(namespace, after=after, limit=pages.PAGE, first=FIRST_PAGE):
        for state in page.states:
            if past(state.key.name, pattern):
                return found
            if matches(state.key.name, pattern):
                found.append(state.key.name)
    return found


def resolve(client: Reservations, pattern: str, wanted: str) -> Key:
    """The one key ``pattern`` names in the client's namespace: the key itself if the store has a
    record of that exact name, else the single record whose name it matches. ``wanted`` says what the
    command acts on (``"a key to forget"``), for the error when there are several or none."""
    exact = client.key(pattern)
    if client.status(exact).fence:  # a record of that very name: the key, whatever else it matches
        return exact
    found = lookup(client, pattern)
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
