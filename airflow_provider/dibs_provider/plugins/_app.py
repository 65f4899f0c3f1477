"""The Reservations page: a small FastAPI app the API server mounts under ``/dibs``.

Server-rendered HTML (Jinja, autoescaped): the page lists keys, a confirmation page asks before a key
is released or forgotten, and a POST does it. Everything works without JavaScript; one small script
(``templates/_page.js``) makes the page part of Airflow's UI, which shows it in a frame: Airflow's
colours, fonts and light or dark mode, and Airflow's own pages (a task, a DAG run) opened in
Airflow's window rather than in the frame. Why not a React app plugin (``react_apps``), as the edge3
provider ships: its bundle is half a megabyte (502 KB, Chakra and Emotion bundled in, since a plugin
gets only React from the host) and needs a Node.js build with its own lock file, to show a table and
two forms that this page renders in about 10 KB with the host's own theme tokens.

Authentication and authorization are Airflow's own, as in the official providers' plugins: the
session cookie (or a bearer token) names the user, and the configured auth manager decides:

* reading the page needs read access to DAGs' task instances (a Viewer has it);
* releasing or forgetting a key needs *edit* access to task instances (``PUT``) of the holder's DAG
  (of any DAG when nobody holds the key): freeing a lease changes what running tasks do, as clearing
  or marking a task does. Every release and forget is written to Airflow's audit log
  (Browse → Audit Log, event ``dibs.release`` / ``dibs.forget``) and to the API server's log.
"""

from __future__ import annotations

import json
import logging
from typing import Annotated, Any
from urllib.parse import urlsplit

import jinja2
from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.base_user import BaseUser
from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from fastapi import Depends, FastAPI, HTTPException, Query, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from markupsafe import Markup, escape

from dibs.display import duration
from dibs.keys import Key
from dibs_provider.links.reservation import page_url
from dibs_provider.plugins._keys import STATES, TaskRef, collect, settings_for

__all__ = ["create_app"]

log = logging.getLogger(__name__)

ACTIONS = {"release": "Release", "forget": "Forget"}
_DONE = {"release": "released", "forget": "forgot"}
_EXPLAIN = {
    "release": "frees the lease now: a waiting task takes the key over at once; the holder's work keeps "
    "running but can no longer store its result.",
    "forget": "deletes everything stored for this key (its artifact and its failures): the next task "
    "that needs it computes it again. A live lease is not touched.",
}

_templates = jinja2.Environment(
    loader=jinja2.PackageLoader("dibs_provider.plugins", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
)


def _seconds(value: float | None) -> str:
    """A duration for people: ``42s``, ``3m 05s``, ``2h 10m``, ``4d 3h``."""
    if value is None:
        return ""
    sign, value = ("-" if value < 0 else ""), abs(value)
    if value < 60:
        return f"{sign}{value:.0f}s"
    minutes, secs = divmod(int(value), 60)
    if minutes < 60:
        return f"{sign}{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{sign}{hours}h {minutes:02d}m"
    return f"{sign}{hours // 24}d {hours % 24}h"


def _size(value: int | None) -> str:
    if value is None:
        return ""
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{value} B"  # pragma: no cover - the loop always returns


def _breakable(value: object) -> Markup:
    """A key, escaped, that a line breaks only after a slash: never inside a name or a digest."""
    return Markup("/<wbr>").join(escape(part) for part in str(value).split("/"))


_templates.filters["seconds"] = _seconds
_templates.filters["breakable"] = _breakable
_templates.filters["duration"] = duration  # a compute time, as ``dibs ls`` shows it: 0.4s, 4m 10s
_templates.filters["size"] = _size


def _render(template: str, status_code: int = 200, **values: Any) -> HTMLResponse:
    html = _templates.get_template(template).render(page=page_url, **values)
    return HTMLResponse(html, status_code=status_code)


def can_edit(user: BaseUser, dag_id: str | None) -> bool:
    """Airflow's edit permission on task instances, of ``dag_id`` (or of DAGs in general)."""
    return get_auth_manager().is_authorized_dag(
        method="PUT",
        access_entity=DagAccessEntity.TASK_INSTANCE,
        details=DagDetails(id=dag_id),
        user=user,
    )


def _same_origin(request: Request) -> None:
    """A state-changing request must come from this site's own page (no cross-site form posts).

    Only a browser's cookie can be sent by another site's form: a request that names its user with a
    bearer token (``Authorization: Bearer``, a script's; no page can make a browser send one) is not
    such a post, and needs no Origin. Who may act is checked all the same, as for the page's form."""
    if request.headers.get("authorization", "").lower().startswith("bearer "):
        return
    origin = request.headers.get("origin") or request.headers.get("referer")
    if not origin:  # browsers send Origin with every form post: a request without either is not one
        raise HTTPException(
            status.HTTP_403_FORBIDDEN, "a request without Origin or Referer cannot release or forget a key"
        )
    if urlsplit(origin).netloc != request.url.netloc:
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"cross-site request from {origin!r} refused")


_can_read = Depends(requires_access_dag("GET", DagAccessEntity.TASK_INSTANCE))
Text = Annotated[str | None, Query(max_length=1000)]


def create_app() -> FastAPI:
    app = FastAPI(title="dibs reservations", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(HTTPException)
    async def _errors(request: Request, exc: HTTPException) -> Response:
        if exc.status_code == status.HTTP_401_UNAUTHORIZED and request.method == "GET":
            return RedirectResponse(get_auth_manager().get_url_login(), status.HTTP_303_SEE_OTHER)
        return _render("error.html", exc.status_code, code=exc.status_code, detail=str(exc.detail))

    @app.get("/", response_class=HTMLResponse, dependencies=[_can_read])
    def reservations(
        *,
        user: GetUserDep,
        session: SessionDep,
        state: Text = None,
        name: Text = None,
        key: Text = None,
        conn: Text = None,
        namespace: Text = None,
        done: Text = None,
    ) -> HTMLResponse:
        state = state or None
        if state is not None and state not in (*STATES, "waited-on"):
            raise HTTPException(
                status.HTTP_400_BAD_REQUEST,
                f"state {state!r} is not one of {', '.join((*STATES, 'waited-on'))}",
            )
        sources = collect(
            session, state=state, name=name or None, key=key or None, conn=conn or None, namespace=namespace
        )
        return _render(
            "reservations.html",
            sources=sources,
            states=STATES,
            state=state or "",
            name=name or "",
            key=key or "",
            conn=conn or "",
            done=done or "",
            can_edit=can_edit(user, None),
            user=user.get_name(),
            # Holders and waiters of DAGs this user may not read are not named (DAG-level access).
            readable=get_auth_manager().get_authorized_dag_ids(user=user, session=session),
        )

    @app.get("/confirm", response_class=HTMLResponse, dependencies=[_can_read])
    def confirm(
        *,
        user: GetUserDep,
        session: SessionDep,
        action: Annotated[str, Query()],
        conn: Annotated[str, Query(max_length=250)],
        namespace: Annotated[str, Query(max_length=250)],
        key: Annotated[str, Query(max_length=1000)],
    ) -> HTMLResponse:
        row, holder = _row_and_holder(session, action, conn, namespace, key)
        _authorize(user, holder, action, key)
        return _render(
            "confirm.html",
            row=row,
            action=action,
            label=ACTIONS[action],
            explain=_EXPLAIN[action],
            conn=conn,
            namespace=namespace,
            key=key,
        )

    @app.post("/keys/{action}", dependencies=[_can_read])
    def act(
        *,
        request: Request,
        user: GetUserDep,
        session: SessionDep,
        action: str,
        conn: Annotated[str, Query(max_length=250)],
        namespace: Annotated[str, Query(max_length=250)],
        key: Annotated[str, Query(max_length=1000)],
        token: Annotated[str, Query(max_length=30)] = "",
    ) -> RedirectResponse:
        _same_origin(request)
        row, holder = _row_and_holder(session, action, conn, namespace, key)
        _authorize(user, holder, action, key)  # against whoever holds the key now
        if str(row.token if row.token is not None else "") != token:
            # The user confirmed another holder: act only on what they saw.
            now = f"held by {row.holder} (token {row.token})" if row.holder else "not held"
            raise HTTPException(
                status.HTTP_409_CONFLICT,
                f"{namespace}/{key} changed since you confirmed (token {token or 'none'}); it is now {now}: "
                "look at it again before you act",
            )
        with settings_for(conn).client(namespace=namespace) as client:
            target = Key(namespace, key)
            changed = client.force_release(target) if action == "release" else client.forget(target)
        _audit(session, user, action=action, conn=conn, key=str(target), holder=holder, changed=changed)
        done = f"{_DONE[action]} {target}" if changed else f"{target}: nothing to {action}"
        return RedirectResponse(page_url("/", conn=conn, done=done), status.HTTP_303_SEE_OTHER)

    return app


def _row_and_holder(
    session: Any, action: str, conn: str, namespace: str, key: str
) -> tuple[Any, TaskRef | None]:
    if action not in ACTIONS:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no action {action!r}; use release or forget")
    sources = collect(session, key=key, conn=conn, namespace=namespace)
    rows = [row for source in sources for row in source.rows]
    if not rows:
        errors = "; ".join(s.error for s in sources if s.error)
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            f"no key {namespace}/{key} in connection {conn!r}" + (f" ({errors})" if errors else ""),
        )
    return rows[0], rows[0].holder_task


def _authorize(user: BaseUser, holder: TaskRef | None, action: str, key: str) -> None:
    dag_id = None if holder is None else holder.dag_id
    if not can_edit(user, dag_id):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"{user.get_name()} may not {action} {key}: that needs Airflow's edit permission on task "
            f"instances{f' of DAG {dag_id}' if dag_id else ''} (a Viewer only reads this page)",
        )


def _audit(
    session: Any, user: BaseUser, *, action: str, conn: str, key: str, holder: TaskRef | None, changed: bool
) -> None:
    from airflow.models.log import Log

    extra = {"key": key, "conn_id": conn, "changed": changed}
    where: dict[str, Any] = {}
    if holder is not None:
        where = {"dag_id": holder.dag_id, "run_id": holder.run_id, "task_id": holder.task_id}
        where["map_index"] = holder.map_index
    session.add(Log(event=f"dibs.{action}", owner=user.get_name(), extra=json.dumps(extra), **where))
    session.commit()
    log.warning(
        "dibs: %s %s %s (connection %s)%s",
        user.get_name(),
        _DONE[action],
        key,
        conn,
        "" if changed else ": nothing changed",
    )
