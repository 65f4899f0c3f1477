"""What :class:`~dibs_provider.triggers.reservation.ReservationTrigger` runs with, in one module it imports
on a thread the first time a trigger runs (importing dibs takes a few tenths of a second, and Airflow
imports a trigger's own module on the triggerer's event loop)."""

from dibs.errors import ReservationError, WaitTimeout
from dibs_provider.hooks.dibs import DibsHook

__all__ = ["DibsHook", "ReservationError", "WaitTimeout"]
