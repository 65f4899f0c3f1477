"""The Python front end's log lines: the ``dibs`` logger's words for a few of the flow's events.

``Reservations.run``/``compute`` (and their async twins) translate the flow's events into log lines
here, and nowhere else; every other front end has its own translator (Airflow's task log, Prefect's
run log, ``dibs run``'s progress lines). Only failures, takeovers and store outages are logged above
INFO, so a call that goes well writes nothing.
"""

from __future__ import annotations

import logging

from dibs import events
from dibs.events import Event

__all__ = ["log_event"]

log = logging.getLogger("dibs")


#: The kinds the log observer wants, by which of INFO, WARNING and ERROR the ``dibs`` logger writes.
_LOGGED: dict[tuple[bool, bool, bool], frozenset[type[Event]]] = {}


class _LogEvents:
    """The Python front end's log lines: the ``dibs`` logger's words for a few of the flow's events
    (only these are built when nobody else listens)."""

    #: Only a failed call's ending and a takeover are logged: a call that succeeds, or that takes a
    #: free key, builds neither event for this observer (see :class:`~dibs.events.Emitter`).
    ignores_routine = frozenset({events.Finished, events.LeaseAcquired})

    @property
    def kinds(self) -> frozenset[type[Event]]:
        """The events whose log lines the ``dibs`` logger would write at its level now: the others
        are not even built for it (a hit's ArtifactFound is logged at INFO, which is usually off)."""
        levels = (
            log.isEnabledFor(logging.INFO),
            log.isEnabledFor(logging.WARNING),
            log.isEnabledFor(logging.ERROR),
        )
        kinds = _LOGGED.get(levels)
        if kinds is None:
            chosen = [(events.ArtifactFound, levels[0]), (events.LeaseAcquired, levels[1])]
            chosen += [(events.RanUnreserved, levels[1]), (events.Finished, levels[2])]
            chosen += [(events.StoreUnreachable, levels[1]), (events.StoreReachable, levels[0])]
            kinds = _LOGGED[levels] = frozenset(kind for kind, logged in chosen if logged)
        return kinds

    def __call__(self, event: Event) -> None:
        if isinstance(event, events.ArtifactFound):
            log.info("%s: using the artifact stored by %s (token %s)", event.key, event.producer, event.token)
        elif isinstance(event, events.LeaseAcquired) and event.took_over_from:
            log.warning(
                "%s: took over the expired lease of %s (token %s)",
                event.key,
                event.took_over_from,
                event.token,
            )
        elif isinstance(event, events.StoreUnreachable):
            patience = (
                "as long as the wait may last" if event.patience is None else f"up to {event.patience:g}s"
            )
            log.warning(
                "%s: the store is unreachable (%s); still waiting, asking it again for %s",
                event.key,
                event.error,
                patience,
            )
        elif isinstance(event, events.StoreReachable):
            log.info("%s: the store answers again after %.1fs; waiting on", event.key, event.seconds)
        elif isinstance(event, events.RanUnreserved):
            log.warning(
                "store unavailable for %s, running unreserved (policy 'run'): %s", event.key, event.error
            )
        elif (
            isinstance(event, events.Finished)
            and event.error_type == "StoreUnavailable"
            and event.token is None
        ):
            log.error("store unavailable for %s, not running it (policy 'fail'): %s", event.key, event.error)


#: The Python front end's translation of the flow's events (both faces of the client).
log_event = _LogEvents()
