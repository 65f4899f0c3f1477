"""prefect-dibs: identical expensive Prefect tasks compute once, across flow runs, processes and machines.

* :func:`reserved`: stack ``@reserved(...)`` over ``@task``; identical calls share one computation
  under a dibs lease, waiters say on whom they wait and return the stored artifact, and a killed
  holder is taken over after its lease's ttl.
* :class:`DibsLockManager`: Prefect's ``LockManager`` on a dibs store, for Prefect's own
  ``isolation_level="SERIALIZABLE"`` caching, with locks that expire when their holder dies.
* :class:`DibsStore`: a block naming the shared store; ``prefect block register -m prefect_dibs``.

See docs/prefect.md.
"""

from __future__ import annotations

from prefect_dibs.blocks import DibsStore
from prefect_dibs.locking import DibsLockManager
from prefect_dibs.tasks import reserved

__all__ = ["DibsLockManager", "DibsStore", "reserved"]
