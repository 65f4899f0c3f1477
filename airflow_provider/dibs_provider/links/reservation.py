"""The "Reservation" button of a reserved task instance: a link to its key on the Reservations page.

Airflow computes operator extra links when a task process finishes (deferring included) and keeps the
URL in an XCom, so the link is built by the task itself, after the key was resolved: a derived key
(``build_features/…digest…``) is known only at run time.

The link opens the page inside Airflow's UI, in the frame Browse → Reservations shows it in, not on
its own: ``/plugin/dibs/dibs/?key=…``, which Airflow 3.3.2+ opens at that page of the frame; before,
``/plugin/dibs?key=…``, whose query the page's script reads from the address around its frame.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode, urlsplit

from airflow.sdk import BaseOperatorLink

from dibs_provider._compat import FRAME_DEEP_LINKS

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey

__all__ = ["PAGE_PREFIX", "URL_ROUTE", "ReservationLink", "base_path", "framed_url", "page_url"]

#: Where the provider's plugin serves the Reservations page (see :mod:`dibs_provider.plugins`).
PAGE_PREFIX = "/dibs"
#: Where Airflow's UI shows it (the plugin's external view's ``url_route``): ``/plugin/dibs``.
URL_ROUTE = "dibs"


def base_path() -> str:
    """The path Airflow's UI is served under (``[api] base_url``), without a trailing slash."""
    try:
        from airflow.configuration import conf

        base_url = str(conf.get("api", "base_url", fallback="/") or "/")
    except Exception:  # a worker without Airflow's core configuration: the default, the root
        base_url = "/"
    return urlsplit(base_url).path.rstrip("/") if "://" in base_url else base_url.rstrip("/")


def page_url(path: str = "/", **query: Any) -> str:
    """A URL of the Reservations page, under Airflow's base path; ``None`` query values are left out."""
    params = {name: value for name, value in query.items() if value is not None}
    return f"{base_path()}{PAGE_PREFIX}{path}" + (f"?{urlencode(params)}" if params else "")


def framed_url(**query: Any) -> str:
    """The Reservations page at ``query`` inside Airflow's UI (see the module docstring)."""
    params = {name: value for name, value in query.items() if value is not None}
    inner = f"{PAGE_PREFIX}/" if FRAME_DEEP_LINKS else ""
    return f"{base_path()}/plugin/{URL_ROUTE}{inner}" + (f"?{urlencode(params)}" if params else "")


class ReservationLink(BaseOperatorLink):
    """Opens the Reservations page at the key a reserved task computed, waits on or waited on."""

    name = "Reservation"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        key = getattr(operator, "reservation_key", None)
        if not isinstance(key, str) or not key:
            return ""  # the task never got as far as its key (Airflow shows no button for "")
        return framed_url(
            conn=getattr(operator, "dibs_conn_id", None),
            namespace=getattr(operator, "reservation_namespace", None),
            key=key,
        )
