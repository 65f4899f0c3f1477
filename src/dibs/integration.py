"""What an orchestrator integration builds on, beyond ``dibs.__all__``.

**For whom**: the authors of a front end that drives dibs' compute-once flow from inside another
system (an orchestrator's operator, task, trigger or lock manager), such as the Airflow provider
(``dibs_provider``) and ``prefect_dibs``. An application using dibs needs only the package itself
(``import dibs``); a third-party store, payload store or observer is written against
:mod:`dibs.stores`, :mod:`dibs.payloads` and :mod:`dibs.events`, and what a front end shows people
comes from :mod:`dibs.display` (docs/architecture.md, "What integrations may use", lists the public
modules).

**The promise**: every name here is public API, as those of ``dibs.__all__`` are: changing one is
changing dibs' public API, done on purpose and said in the release notes (while dibs is 0.x, such a
change may still come in a minor release). The modules these names come from are the core's own and
may change in any release: import the names from here, as both integrations do
(``tests/unit/test_layering.py`` holds them to it).

What is here, by what an integration does with it:

=================================  ==============================================================
driving the flow                   :class:`Call` (``Reservations.call`` makes one), the seam that
                                   carries its steps out, :class:`StoreIO`/:class:`AsyncStoreIO`, to
                                   subclass for the steps the front end does its own way (their
                                   handlers take the steps: :class:`Wait`, :class:`Found`,
                                   :class:`Work`, :class:`Keep`, :class:`RunUnreserved`), and
                                   :class:`Suspend`/:class:`Waiting` to defer at the wait step and
                                   resume elsewhere (see :mod:`dibs.flow` and :mod:`dibs.seam`); a
                                   call that keeps its lease (a lock) ends later, when the lease is
                                   given back: :class:`Kept`, :func:`kept_ended`
holding the work's lease           :class:`HeldLease` (let go from outside the work: a kill, a lock
                                   released in a later call), the :class:`Logger` it writes to,
                                   :func:`failure_text` (a failure as the store records it)
one process, one runtime           :func:`runtime`: the process's shared stores and its I/O
                                   executor (an integration's store calls go there too)
settings said early                :func:`validate_seconds`, :func:`validate_timings` (an option
                                   refused when the task is defined, with the core's wording),
                                   :func:`checked` (a misspelt ``**options`` keyword refused),
                                   :class:`Deadline` (a wait's timeout), :class:`Configured`
defaults                           :data:`STORE_URL_ENV`, :func:`default_store_url`,
                                   :func:`default_owner`
many waiters on one event loop     :func:`resolve_in_batches`, :func:`take_turn` (a trigger that
                                   wakes a thousand deferred tasks at once)
a hit handed on unread             :func:`unread_hit` (a payload's hit as the artifact itself, for a
                                   front end that hands a reference on)
=================================  ==============================================================
"""

from __future__ import annotations

from dibs._batches import resolve_in_batches, take_turn
from dibs.artifacts import unread_hit
from dibs.backoff import Deadline
from dibs.config import STORE_URL_ENV, default_owner, default_store_url, validate_seconds
from dibs.flow import Call, kept_ended
from dibs.holding import HeldLease, Logger, failure_text
from dibs.options import checked
from dibs.runtime import runtime
from dibs.seam import AsyncStoreIO, StoreIO
from dibs.settings import Configured, validate_timings
from dibs.steps import Found, Keep, Kept, RunUnreserved, Suspend, Wait, Waiting, Work

__all__ = [
    "STORE_URL_ENV",
    "AsyncStoreIO",
    "Call",
    "Configured",
    "Deadline",
    "Found",
    "HeldLease",
    "Keep",
    "Kept",
    "Logger",
    "RunUnreserved",
    "StoreIO",
    "Suspend",
    "Wait",
    "Waiting",
    "Work",
    "checked",
    "default_owner",
    "default_store_url",
    "failure_text",
    "kept_ended",
    "resolve_in_batches",
    "runtime",
    "take_turn",
    "unread_hit",
    "validate_seconds",
    "validate_timings",
]
