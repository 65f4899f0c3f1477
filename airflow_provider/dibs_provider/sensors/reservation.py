"""Wait for a key's artifact without ever computing it.

:class:`ReservationSensor` is for tasks that need another DAG's reserved result but must not produce it
themselves (a report that waits for the nightly features). It pokes the store once; if the artifact is
not there it defers to :class:`ReservationTrigger` with ``for_artifact=True`` (a freed or expired lease
does not end the wait: only an artifact does), so no worker slot is held. When the artifact exists,
its value becomes the sensor's return value (XCom).

A poke is one look of the core's wait (:meth:`dibs.Reservations.wait`, ``timeout=0``), so which
artifact counts (``max_age``) is decided where it is for every waiter. A sensor holds nothing, so a
store that cannot be reached is "not yet": a deferrable sensor defers anyway (its trigger rides the
outage out for the connection's ``outage_patience``, as a reserved task's does, and fails with the
store's error after that, as the task does); a poking sensor pokes again, until its own ``timeout``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue

from dibs.errors import StoreUnavailable, WaitTimeout
from dibs.integration import validate_seconds
from dibs_provider._compat import AirflowSensorTimeout, AirflowSkipException
from dibs_provider.hooks.dibs import DEFAULT_CONN_ID, DibsHook
from dibs_provider.triggers.reservation import ReservationTrigger, error_from_event, parse_event

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["ReservationSensor"]


class ReservationSensor(BaseSensorOperator):
    """Succeed once ``key`` has an artifact; return the artifact's value.

    :param key: the key name (templated), e.g. ``"features-{{ ds }}"``: the ``key=`` the producing
        reserved task uses.
    :param namespace: the key's namespace (templated); default: the connection's.
    :param dibs_conn_id: the ``dibs`` connection (default ``dibs_default``).
    :param deferrable: poke once, then defer (default); ``False`` uses the classic poke/reschedule modes.
    :param max_age: an artifact this many seconds old does not count (default: the connection's).

    ``timeout``, ``soft_fail``, ``poke_interval`` and ``mode`` are the usual sensor arguments.
    """

    template_fields: Sequence[str] = ("key", "namespace")

    def __init__(
        self,
        *,
        key: str,
        namespace: str | None = None,
        dibs_conn_id: str = DEFAULT_CONN_ID,
        deferrable: bool = True,
        max_age: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.key = key
        self.namespace = namespace
        self.dibs_conn_id = dibs_conn_id
        self.deferrable = deferrable
        self.max_age = validate_seconds("max_age", max_age, allow_none=True)

    #: The hook of the last poke: the connection it read goes to the trigger (``for_trigger``).
    _hook: DibsHook | None = None

    def poke(self, context: Context) -> bool | PokeReturnValue:
        hook = self._hook = DibsHook(self.dibs_conn_id, namespace=self.namespace)
        with hook.get_client() as client:
            try:
                hit = client.wait(self.key, for_artifact=True, timeout=0, max_age=self.max_age)
            except WaitTimeout as exc:  # not done yet: the core's words say who holds it, or why not
                self.log.info("dibs: %s", exc.message)
                return False
            except StoreUnavailable as exc:  # a sensor holds nothing: an outage is "not yet"
                self.log.warning("dibs: the store is unreachable (%s); the sensor waits on", exc)
                return False
        assert hit is not None  # for_artifact: only an artifact ends a wait
        self.log.info("dibs: %s was computed by %s (token %s)", hit.key, hit.producer, hit.token)
        return PokeReturnValue(is_done=True, xcom_value=hit.value)

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        return self._poke_or_defer(context, wait_started=time.time(), deferrals=0)

    def _poke_or_defer(self, context: Context, *, wait_started: float, deferrals: int) -> Any:
        poked = self.poke(context)
        if isinstance(poked, PokeReturnValue):
            return poked.xcom_value
        remaining = max(0.0, self.timeout - (time.time() - wait_started))
        if remaining <= 0:  # the first poke itself outlasted the timeout (a slow store, a busy worker)
            self._timed_out(f"{self.key}: no artifact after {self.timeout:g}s")
        self.defer(
            trigger=ReservationTrigger(
                self.key,
                namespace=self.namespace,
                dibs_conn_id=self.dibs_conn_id,
                for_artifact=True,
                max_age=self.max_age,
                timeout=remaining,
                wait_started=wait_started,
                deferrals=deferrals + 1,
                connection=None if self._hook is None else self._hook.for_trigger(),
            ),
            method_name="execute_complete",
            # Airflow's own deadline, a backstop for a triggerer that cannot reach the store at all.
            timeout=timedelta(seconds=remaining),
        )

    def _timed_out(self, message: str) -> None:
        """The sensor's timeout passed: ``soft_fail`` and ``never_fail`` skip, as Airflow's own poke loop
        decides, which a deferrable sensor's ``execute`` bypasses."""
        if self.soft_fail or getattr(self, "never_fail", False):  # never_fail: Airflow 3.2 and later
            raise AirflowSkipException(f"{message} (skipped: soft_fail or never_fail is set)")
        raise AirflowSensorTimeout(message)

    def execute_complete(self, context: Context, event: object = None, **_: Any) -> Any:
        ev = parse_event(event)
        if ev["status"] == "timeout":
            # AirflowSensorTimeout (not WaitTimeout) so that soft_fail / never_fail apply as for any sensor.
            raise AirflowSensorTimeout(error_from_event(ev).message)
        if ev["status"] == "error":
            raise error_from_event(ev)
        # "done": read the artifact now. If it vanished meanwhile (someone ran `dibs forget`), wait again.
        return self._poke_or_defer(
            context, wait_started=float(ev["wait_started"]), deferrals=int(ev["deferrals"])
        )
