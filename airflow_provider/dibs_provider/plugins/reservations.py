"""The provider's Airflow plugin: the Reservations page in Airflow's UI (Airflow 3.1+).

Registered the way official providers register theirs: ``plugins`` in ``get_provider_info`` and an
``airflow.plugins`` entry point. The page is a FastAPI app (:mod:`._app`) the API server mounts under
``/dibs``; ``external_views`` puts it in the UI's *Browse* menu, where Airflow shows it inside its own
frame. The "Reservation" button of a reserved task instance is :class:`ReservationLink`.

The app (and Airflow's API modules it needs) is built only in the API server: every other component
loads plugins too (the scheduler, task processes), and has no use for it.
"""

from __future__ import annotations

import sys
from typing import Any

from airflow.plugins_manager import AirflowPlugin

from dibs_provider.links.reservation import PAGE_PREFIX, URL_ROUTE, ReservationLink, page_url

__all__ = ["DibsReservationsPlugin"]


def _in_api_server() -> bool:
    """Whether this process serves Airflow's API: ``airflow api-server``, or anything that has built
    Airflow's FastAPI app (which loads plugins while it is being built)."""
    return (len(sys.argv) > 1 and sys.argv[1] == "api-server") or "airflow.api_fastapi.app" in sys.modules


def _fastapi_apps() -> list[dict[str, Any]]:
    if not _in_api_server():
        return []
    from dibs_provider.plugins._app import create_app

    return [{"app": create_app(), "url_prefix": PAGE_PREFIX, "name": "dibs reservations"}]


class DibsReservationsPlugin(AirflowPlugin):
    """Reservations: who holds which dibs key, who waits on it, and what is stored."""

    name = "dibs"
    fastapi_apps = _fastapi_apps()
    external_views = [
        {
            "name": "Reservations",
            "href": page_url("/"),
            "destination": "nav",
            "category": "browse",
            "url_route": URL_ROUTE,
        }
    ]
    global_operator_extra_links = []
    operator_extra_links = [ReservationLink()]
