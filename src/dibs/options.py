"""The options a client's calls take, and the ask they make of the store, written once for both faces.

Each kind of call takes its options as one :class:`~typing.TypedDict` (``**options``), so a signature
is written once and type checkers still see every option; :func:`checked` refuses a misspelt one as
Python refuses an unknown keyword. :func:`ask_of` turns a call's options and the client's settings into
the one :class:`~dibs.steps.Ask` the flow makes: the lease's terms (the call's, else the client's,
checked together) and which artifact counts (a refresh takes none that exists).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, Required, TypedDict

from dibs.config import default_owner, validate_seconds
from dibs.errors import ConfigurationError
from dibs.events import Observer
from dibs.keys import Key
from dibs.settings import Settings, validate_timings
from dibs.steps import Ask
from dibs.stores.requests import AcquireRequest

__all__ = [
    "AcquireOptions",
    "AcquireOrBusy",
    "AcquireRaising",
    "AskOptions",
    "CallOptions",
    "WaitOptions",
    "ask_of",
    "checked",
    "max_age_of",
    "terms",
]


# -- the options of each kind of call ------------------------------------------------------------
class AskOptions(TypedDict, total=False):
    """The options of one ask (:meth:`dibs.Reservations.get_or_reserve`; ``acquire`` adds its own).

    ``ttl`` and ``max_lease_age`` override the client's for this lease; an artifact ``max_age`` old is
    a miss; ``refresh`` takes the lease even beside an artifact; ``min_token`` takes only an artifact
    stored under that token or a later one."""

    ttl: float | None
    max_lease_age: float | None
    max_age: float | None
    refresh: bool
    min_token: int | None


class AcquireOptions(AskOptions, total=False):
    """:meth:`dibs.Reservations.acquire`'s options: an ask's, how long to wait, and what a timeout does."""

    timeout: float | None
    raise_on_timeout: bool


class AcquireRaising(AskOptions, total=False):
    """:class:`AcquireOptions` that raise on a timeout (the default): the answer is never busy."""

    timeout: float | None
    raise_on_timeout: Literal[True]


class AcquireOrBusy(AskOptions, total=False):
    """:class:`AcquireOptions` with ``raise_on_timeout=False``: a timeout answers the last busy."""

    timeout: float | None
    raise_on_timeout: Required[Literal[False]]


class WaitOptions(TypedDict, total=False):
    """:meth:`dibs.Reservations.wait`'s options (see there). ``decode=False`` waits for the record
    only: the hit's ``value`` is the stored artifact itself, never decoded, and a payload in a payload
    store is only checked to be there with its recorded size, never opened (what Airflow's triggerer
    waits for: the resumed task reads the value). ``resumed=True``: the wait continues one that reached
    the store before (a deferred task's trigger), so a store outage is ridden out from its first read."""

    timeout: float | None
    for_artifact: bool
    max_age: float | None
    min_token: int | None
    decode: bool
    resumed: bool


class CallOptions(TypedDict, total=False):
    """The options of a compute-once call (:meth:`dibs.Reservations.compute`, ``call``)."""

    owner: str | None
    timeout: float | None
    max_age: float | None
    refresh: bool
    observer: Observer | None


def checked(call: str, options: Mapping[str, object], kind: type[Mapping[str, object]]) -> None:
    """Refuse an option ``call`` does not take, as Python refuses an unknown keyword argument (the
    options arrive as ``**options``, which would otherwise take any name and ignore a misspelt one)."""
    if not options:  # the usual call: nothing to check
        return
    known = _KNOWN.get(kind)
    if known is None:
        known = _KNOWN[kind] = getattr(kind, "__optional_keys__", frozenset()) | getattr(
            kind, "__required_keys__", frozenset()
        )
    for name in options:
        if name not in known:
            raise TypeError(f"{call}() got an unexpected keyword argument {name!r}")


#: The option names of each kind of call, read once (``checked`` runs twice in every ``run``).
_KNOWN: dict[type[Mapping[str, object]], frozenset[str]] = {}


def terms(settings: Settings, ttl: float | None, max_lease_age: float | None) -> tuple[float, float | None]:
    """The ttl and maximum age of one lease: the call's, else the client's; checked together."""
    if ttl is None and max_lease_age is None:  # the client's own, checked together when it was made
        return settings.ttl, settings.max_lease_age
    ttl = settings.ttl if ttl is None else ttl
    max_lease_age = settings.max_lease_age if max_lease_age is None else max_lease_age
    checked_ttl, _, checked_age = validate_timings(ttl=ttl, max_lease_age=max_lease_age)
    assert checked_ttl is not None
    return checked_ttl, checked_age


def max_age_of(settings: Settings, max_age: float | None) -> float | None:
    """The call's maximum artifact age, else the client's; checked."""
    if max_age is None:
        return settings.max_age
    return validate_seconds("max_age", max_age, allow_none=True)


def ask_of(settings: Settings, key: Key, owner: str | None, options: AskOptions) -> Ask:
    """One ask: the lease's terms, and which artifact counts (a refresh takes none that exists)."""
    max_age = 0.0 if options.get("refresh", False) else max_age_of(settings, options.get("max_age"))
    min_token = options.get("min_token")
    if min_token is not None and (isinstance(min_token, bool) or not isinstance(min_token, int)):
        raise ConfigurationError(f"min_token must be a lease's token (an int), got {min_token!r}")
    ttl, max_lease_age = terms(settings, options.get("ttl"), options.get("max_lease_age"))
    owner = default_owner() if owner is None else owner  # an empty one is refused (validate_owner)
    return Ask(key, AcquireRequest(owner, ttl, max_lease_age, max_age, min_token))
