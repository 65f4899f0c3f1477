"""The settings of a client, validated in one place.

The core client, the Airflow connection, the Prefect block, ``@reserved`` and the lock manager all
take the same timings and policies. They all end up in one :class:`Settings`, whose checks are the
only ones: an integration that accepts a partial override early (a decorator argument, say) checks it
with :func:`validate_timings`, the same rule, so no two places can disagree about it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from dibs.backoff import DEFAULT_OUTAGE_PATIENCE, Backoff
from dibs.config import validate_seconds
from dibs.errors import ConfigurationError
from dibs.keys import validate_namespace
from dibs.serializers import Serializer, resolve_serializer

__all__ = [
    "DEFAULT_TTL",
    "MIN_HEARTBEAT_INTERVAL",
    "MIN_TTL",
    "Configured",
    "Settings",
    "StoreUnavailablePolicy",
    "validate_timings",
]

DEFAULT_TTL = 60.0
#: A heartbeat every third of the ttl: two may fail in a row before the lease is at risk.
HEARTBEATS_PER_TTL = 3
#: The shortest heartbeat interval dibs accepts: 50 ms. Below it a holder does nothing but write to
#: the store (``ttl=1e-9`` once heartbeated 2,609 times a second on SQLite, issue 16 item 6), and a
#: lease that short cannot survive one store round trip anyway, so a rival takes the key regardless.
MIN_HEARTBEAT_INTERVAL = 0.05
#: The shortest ttl: room for the default three heartbeats, none of them below the interval floor.
MIN_TTL = HEARTBEATS_PER_TTL * MIN_HEARTBEAT_INTERVAL

StoreUnavailablePolicy = Literal["fail", "run"]


def validate_timings(
    *, ttl: object = None, heartbeat_interval: object = None, max_lease_age: object = None
) -> tuple[float | None, float | None, float | None]:
    """Check whichever of the three timings are given, alone and against each other.

    Returns them as floats (``None`` where not given). The rules: each is a positive, finite, bounded
    number of seconds; the ttl is at least :data:`MIN_TTL` (unless the maximum lease age is no longer
    than the ttl, so the lease is never extended) and the heartbeat interval at least
    :data:`MIN_HEARTBEAT_INTERVAL` (shorter ones only spin against the store); heartbeats come more
    often than the ttl (or the lease would expire between two of them); a maximum lease age is at
    least one ttl. Every entry point (the client and its per-call ttl, ``Lease.keep_alive``, the
    Airflow connection and operators, the Prefect block and ``@reserved``, ``dibs run --ttl``) ends
    up here.
    """
    checked_ttl = validate_seconds("ttl", ttl, allow_none=True)
    interval = validate_seconds("heartbeat_interval", heartbeat_interval, allow_none=True)
    max_age = validate_seconds("max_lease_age", max_lease_age, allow_none=True)
    # A lease whose maximum age is its ttl can never be extended: however short, it cannot spin (a
    # Prefect lock with hold_timeout=0.1 is one). Only leases that heartbeat need the floor.
    capped = checked_ttl is not None and max_age is not None and max_age <= checked_ttl
    for name, value, floor in (
        ("ttl", None if capped else checked_ttl, MIN_TTL),
        ("heartbeat_interval", interval, MIN_HEARTBEAT_INTERVAL),
    ):
        if value is not None and value < floor:
            raise ConfigurationError(
                f"{name} must be at least {floor:g} seconds, got {value!r}: a shorter one only makes the "
                "holder write to the store in a loop, and a rival takes the key anyway",
                setting=name,
            )
    if checked_ttl is not None and interval is not None and interval >= checked_ttl:
        raise ConfigurationError(
            f"heartbeat_interval ({interval:g}s) must be shorter than ttl ({checked_ttl:g}s), or the lease "
            "expires between heartbeats; a third of the ttl is a good choice",
            setting="heartbeat_interval",
        )
    if checked_ttl is not None and max_age is not None and max_age < checked_ttl:
        raise ConfigurationError(
            f"max_lease_age ({max_age:g}s) must be at least the ttl ({checked_ttl:g}s)",
            setting="max_lease_age",
        )
    return checked_ttl, interval, max_age


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything a :class:`dibs.Reservations` client decides with, checked when it is built.

    :param namespace: the namespace of keys given as plain strings.
    :param ttl: seconds a lease lives without a heartbeat; a crashed holder is taken over this long
        after its last heartbeat.
    :param heartbeat_interval: seconds between heartbeats (default a third of the ttl).
    :param max_lease_age: if set, no lease lives longer than this, however often it heartbeats.
    :param max_age: if set, an artifact this old (by the store's clock) is a miss: the next caller
        computes the key again under a lease, and its waiters share the new value.
    :param max_failures: after this many recorded failures of a key, :class:`dibs.TooManyFailures`
        instead of another attempt, until someone runs ``dibs forget``. ``None``: try forever.
    :param on_store_unavailable: ``"fail"`` raises :class:`dibs.StoreUnavailable`; ``"run"`` runs the
        work unreserved (and logs it), so the lock never changes a result.
    :param serializer: ``"json"`` (default), ``"bytes"``, ``"pickle"`` (needs ``signing_key``) or an object.
    :param signing_key: the HMAC key of pickled artifacts.
    :param backoff: how often a waiter asks again (:class:`dibs.Backoff`).
    :param outage_patience: seconds a waiter keeps waiting while the store cannot be reached (it holds
        nothing, so it has nothing at stake): 60 by default, the length of a managed database's
        failover; ``None``: as long as its own timeout allows; ``0``: not at all. Only a call's first ask
        applies ``on_store_unavailable`` instead (see :class:`dibs.Outage`).
    """

    namespace: str = "default"
    ttl: float = DEFAULT_TTL
    heartbeat_interval: float | None = None
    max_lease_age: float | None = None
    max_age: float | None = None
    max_failures: int | None = None
    on_store_unavailable: StoreUnavailablePolicy = "fail"
    serializer: Serializer | str = "json"
    signing_key: bytes | str | None = dataclasses.field(default=None, repr=False)
    backoff: Backoff = dataclasses.field(default_factory=Backoff)
    outage_patience: float | None = DEFAULT_OUTAGE_PATIENCE

    def __post_init__(self) -> None:
        validate_namespace(self.namespace)
        validate_seconds("ttl", self.ttl)  # required here: the message must not offer None
        ttl, interval, max_age = validate_timings(
            ttl=self.ttl, heartbeat_interval=self.heartbeat_interval, max_lease_age=self.max_lease_age
        )
        object.__setattr__(self, "ttl", ttl)
        object.__setattr__(self, "heartbeat_interval", interval)
        object.__setattr__(self, "max_lease_age", max_age)
        object.__setattr__(self, "max_age", validate_seconds("max_age", self.max_age, allow_none=True))
        failures = self.max_failures
        if failures is not None and (
            isinstance(failures, bool) or not isinstance(failures, int) or failures < 1
        ):
            raise ConfigurationError(
                f"max_failures must be a positive integer or None, got {failures!r}", setting="max_failures"
            )
        if self.on_store_unavailable not in ("fail", "run"):
            raise ConfigurationError(
                f"on_store_unavailable must be 'fail' or 'run', got {self.on_store_unavailable!r}",
                setting="on_store_unavailable",
            )
        object.__setattr__(
            self,
            "outage_patience",
            validate_seconds("outage_patience", self.outage_patience, allow_none=True, allow_zero=True),
        )
        if not isinstance(self.backoff, Backoff):
            raise ConfigurationError(
                f"backoff must be a dibs.Backoff, got {type(self.backoff).__name__}", setting="backoff"
            )
        if self.serializer is None:
            object.__setattr__(self, "serializer", "json")
        self.make_serializer()  # a pickle without a signing key, an unknown name: said now, not at first use

    def make_serializer(self) -> Serializer:
        """The serializer object these settings name (objects are used as they are)."""
        return resolve_serializer(self.serializer, signing_key=self.signing_key)

    @property
    def heartbeat_every(self) -> float:
        """Seconds between heartbeats of a lease taken with :attr:`ttl`."""
        assert self.ttl is not None
        return (
            self.heartbeat_interval if self.heartbeat_interval is not None else self.ttl / HEARTBEATS_PER_TTL
        )

    def heartbeat_for(self, ttl: float) -> float:
        """Seconds between heartbeats of a lease taken with ``ttl`` (a per-call ttl gets a third of it,
        unless the configured interval is already shorter)."""
        if ttl == self.ttl:
            return self.heartbeat_every
        third = ttl / HEARTBEATS_PER_TTL
        return min(third, self.heartbeat_interval) if self.heartbeat_interval is not None else third

    def replace(self, **changes: Any) -> Settings:
        """These settings with ``changes`` applied (``None`` values keep the current setting), checked."""
        given = {name: value for name, value in changes.items() if value is not None}
        if not given:
            return self  # frozen: the same settings (a client per trigger asked for this, issue 20)
        unknown = set(given) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ConfigurationError(f"unknown setting(s) {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **given)


class Configured:
    """The fields of the :class:`Settings` an object keeps as ``settings``, read as its own
    (``client.ttl``): a client's and an Airflow connection's are read the same way."""

    settings: Settings

    @property
    def namespace(self) -> str:
        return self.settings.namespace

    @property
    def ttl(self) -> float:
        return self.settings.ttl

    @property
    def heartbeat_interval(self) -> float:
        """Seconds between heartbeats (the configured interval, else a third of the ttl)."""
        return self.settings.heartbeat_every

    @property
    def max_lease_age(self) -> float | None:
        return self.settings.max_lease_age

    @property
    def max_age(self) -> float | None:
        return self.settings.max_age

    @property
    def max_failures(self) -> int | None:
        return self.settings.max_failures

    @property
    def on_store_unavailable(self) -> StoreUnavailablePolicy:
        return self.settings.on_store_unavailable

    @property
    def backoff(self) -> Backoff:
        return self.settings.backoff

    @property
    def outage_patience(self) -> float | None:
        return self.settings.outage_patience
