"""What the Reservations page shows: the keys of the deployment's dibs connections and who waits on them.

Two sources, joined here:

* the dibs stores of the ``dibs`` connections (metadata database and ``AIRFLOW_CONN_*`` variables),
  read a page at a time with the store's bounded reads (:mod:`dibs.stores.pages`, filtered by
  status in the store): state, holder, token, expiry, artifact, last failure;
* Airflow's own trigger rows: a deferred reserved task waits in a :class:`ReservationTrigger` whose
  kwargs name its connection, namespace and key. The kwargs are stored encrypted (Fernet) and
  serialized; :attr:`airflow.models.trigger.Trigger.kwargs` is the one way to read them back.

A lease's owner is the logical task, ``dag_id/run_id/task_id/map_index`` (see
:func:`dibs_provider.operators.reserved.task_owner`), which is how a holder links to its DAG run.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal, cast
from urllib.parse import quote, urlsplit

from dibs.keys import Key
from dibs.records import KeyState
from dibs.stores import Store, hide_secrets, url_secrets
from dibs_provider.hooks.dibs import (
    CONN_TYPE,
    DEFAULT_CONN_ID,
    DibsSettings,
    fallback_settings,
    settings_from_connection,
)
from dibs_provider.links.reservation import base_path

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

__all__ = ["KeyRow", "Source", "TaskRef", "Waiter", "collect", "settings_for"]

TRIGGER_CLASSPATH = "dibs_provider.triggers.reservation.ReservationTrigger"
STATES = ("held", "done", "expired", "failed", "free")
#: Rows shown per store and namespace: a page, not an export (``dibs ls`` lists everything). The
#: store is read a page at a time until this many match, not whole (issue 30).
MAX_ROWS = 500


@dataclasses.dataclass(frozen=True)
class TaskRef:
    """A task instance named by a lease owner or a trigger row, with its pages in Airflow's UI."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int

    @classmethod
    def parse(cls, owner: str | None) -> TaskRef | None:
        """``dag_id/run_id/task_id/map_index`` (a reserved task's owner); ``None`` for other owners
        (a script, a Prefect task), which have no page in Airflow."""
        if not owner:
            return None
        dag_id, _, rest = owner.partition("/")
        parts = rest.rsplit("/", 2)
        if len(parts) != 3 or not dag_id:
            return None
        run_id, task_id, index = parts
        try:
            map_index = int(index)
        except ValueError:
            return None
        return cls(dag_id, run_id, task_id, map_index) if run_id and task_id else None

    @property
    def run_url(self) -> str:
        return f"{base_path()}/dags/{quote(self.dag_id, safe='')}/runs/{quote(self.run_id, safe='')}"

    @property
    def task_url(self) -> str:
        url = f"{self.run_url}/tasks/{quote(self.task_id, safe='')}"
        return url if self.map_index < 0 else f"{url}/mapped/{self.map_index}"

    @property
    def label(self) -> str:
        index = "" if self.map_index < 0 else f"[{self.map_index}]"
        return f"{self.task_id}{index}"


@dataclasses.dataclass(frozen=True)
class Waiter:
    """A deferred task instance whose trigger watches a key."""

    conn_id: str
    namespace: str | None
    key: str
    task: TaskRef
    try_number: int
    wait_started: float | None


@dataclasses.dataclass(frozen=True)
class KeyRow:
    """One key as the page shows it (times in seconds, measured on the store's clock)."""

    namespace: str
    name: str
    status: str
    holder: str | None = None
    holder_task: TaskRef | None = None
    token: int | None = None
    expires_in: float | None = None
    waiters: tuple[Waiter, ...] = ()
    artifact_age: float | None = None
    size: int | None = None
    producer: str | None = None
    producer_task: TaskRef | None = None
    #: How long the producer took to compute the artifact; ``None`` when not recorded (older artifacts).
    compute_seconds: float | None = None
    failure: str | None = None
    failure_owner: str | None = None
    failures: int = 0

    @classmethod
    def of(cls, state: KeyState, waiters: Iterable[Waiter]) -> KeyRow:
        lease, artifact, failure = state.live_lease, state.artifact, state.failure
        if lease is None and state.lease is not None and state.artifact is None:
            lease = state.lease  # expired, nobody took it over yet: still who held it last
        return cls(
            namespace=state.key.namespace,
            name=state.key.name,
            status=state.status,
            holder=None if lease is None else lease.owner,
            holder_task=None if lease is None else TaskRef.parse(lease.owner),
            token=None if lease is None else lease.token.fence,
            expires_in=None if lease is None else lease.expires_at - state.now,
            waiters=tuple(waiters),
            artifact_age=None if artifact is None else max(0.0, state.now - artifact.created_at),
            size=None if artifact is None else artifact.size,
            producer=None if artifact is None else artifact.producer,
            producer_task=None if artifact is None else TaskRef.parse(artifact.producer),
            compute_seconds=None if artifact is None else artifact.compute_seconds,
            failure=None if failure is None else failure.error,
            failure_owner=None if failure is None else failure.owner,
            failures=0 if failure is None else failure.count,
        )


@dataclasses.dataclass
class Source:
    """One store and namespace, and the connections that point at it."""

    conn_ids: list[str]
    store: str
    namespace: str
    rows: list[KeyRow] = dataclasses.field(default_factory=list)
    error: str | None = None
    truncated: bool = False


def _env_conn_type(value: str) -> str | None:
    """The conn_type of an ``AIRFLOW_CONN_*`` value: JSON (``{"conn_type": ...}``) or a URI."""
    value = value.strip()
    if value.startswith("{"):
        try:
            parsed = json.loads(value)
        except ValueError:
            return None
        return parsed.get("conn_type") if isinstance(parsed, dict) else None
    return urlsplit(value).scheme.replace("-", "_") or None


def dibs_conn_ids(session: Session, waiters: Iterable[Waiter]) -> list[str]:
    """Every connection of type ``dibs`` the API server can see, and any a waiting task names."""
    from airflow.models.connection import Connection
    from sqlalchemy import select

    ids = set(session.scalars(select(Connection.conn_id).where(Connection.conn_type == CONN_TYPE)))
    for name, value in os.environ.items():
        if name.startswith("AIRFLOW_CONN_") and _env_conn_type(value) == CONN_TYPE:
            ids.add(name.removeprefix("AIRFLOW_CONN_").lower())
    ids.update(waiter.conn_id for waiter in waiters)
    return sorted(ids) or [DEFAULT_CONN_ID]


def settings_for(conn_id: str) -> DibsSettings:
    """The checked settings of a connection, read as the API server reads connections (secrets
    backends, environment, metadata database); ``dibs_default`` may be absent (the fallback store)."""
    from airflow.models.connection import Connection

    from dibs_provider._compat import AirflowNotFoundException

    try:
        conn = Connection.get_connection_from_secrets(conn_id)
    except AirflowNotFoundException:
        if conn_id != DEFAULT_CONN_ID:
            raise
        return fallback_settings(conn_id)
    return settings_from_connection(cast("Any", conn))


def deferred_waiters(session: Session) -> list[Waiter]:
    """The deferred task instances whose :class:`ReservationTrigger` watches a key."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.trigger import Trigger
    from airflow.utils.state import TaskInstanceState
    from sqlalchemy import select

    query = (
        select(Trigger, TaskInstance)
        .join(TaskInstance, TaskInstance.trigger_id == Trigger.id)
        .where(Trigger.classpath == TRIGGER_CLASSPATH, TaskInstance.state == TaskInstanceState.DEFERRED)
    )
    waiters = []
    for trigger, ti in session.execute(query):
        kwargs: dict[str, Any] = trigger.kwargs  # decrypted and deserialized by Airflow's model
        key = kwargs.get("key")
        if not isinstance(key, str):
            continue
        started = kwargs.get("wait_started")
        waiters.append(
            Waiter(
                conn_id=str(kwargs.get("dibs_conn_id") or DEFAULT_CONN_ID),
                namespace=kwargs.get("namespace"),
                key=key,
                task=TaskRef(ti.dag_id, ti.run_id, ti.task_id, ti.map_index),
                try_number=ti.try_number,
                wait_started=float(started) if isinstance(started, int | float) else None,
            )
        )
    return waiters


def _matches(row: KeyRow, state: str | None, name: str | None, key: str | None) -> bool:
    if key is not None and row.name != key:
        return False
    if state == "waited-on":
        if not row.waiters:
            return False
    elif state and row.status != state:
        return False
    if name:
        pattern = name if any(c in name for c in "*?[") else f"*{name}*"
        return fnmatch.fnmatchcase(row.name.lower(), pattern.lower())
    return True


def collect(
    session: Session,
    *,
    state: str | None = None,
    name: str | None = None,
    key: str | None = None,
    conn: str | None = None,
    namespace: str | None = None,
) -> list[Source]:
    """Read every store once and join the waiters to their keys; filters as on the page."""
    waiters = deferred_waiters(session)
    conn_ids = [c for c in dibs_conn_ids(session, waiters) if conn is None or c == conn]
    sources: dict[tuple[str, str], Source] = {}
    settings_of: dict[str, DibsSettings] = {}
    errors: list[Source] = []
    for conn_id in conn_ids:
        try:
            settings = settings_of[conn_id] = settings_for(conn_id)
        except Exception as exc:  # a broken connection is shown, the others still are
            errors.append(Source([conn_id], "?", "?", error=f"{type(exc).__name__}: {exc}"))
            continue
        namespaces = {settings.namespace}
        namespaces.update(w.namespace for w in waiters if w.conn_id == conn_id and w.namespace)
        for ns in sorted(namespaces):
            if namespace is not None and ns != namespace:
                continue
            found = sources.setdefault((settings.store_url, ns), Source([], settings.display_url, ns))
            found.conn_ids.append(conn_id)
    for (_, ns), source in sources.items():
        settings = settings_of[source.conn_ids[0]]
        mine = [
            w
            for w in waiters
            if w.conn_id in source.conn_ids and (w.namespace or settings_of[w.conn_id].namespace) == ns
        ]
        _fill(source, settings, mine, state=state, name=name, key=key)
    return errors + sorted(sources.values(), key=lambda s: (s.conn_ids[0], s.namespace))


def _fill(
    source: Source,
    settings: DibsSettings,
    waiters: list[Waiter],
    *,
    state: str | None,
    name: str | None,
    key: str | None,
) -> None:
    """The rows of one store and namespace, read through the store's bounded reads (issue 30): the
    keys tasks wait on (each read directly), then each status in the page's order a page at a time
    (:meth:`Store.list_page <dibs.stores.base.Store.list_page>`, the status filtered in the store),
    until :data:`MAX_ROWS` rows match, never the whole namespace at once. A name filter is applied to
    the pages as they come."""
    by_key: dict[str, list[Waiter]] = {}
    for waiter in waiters:
        by_key.setdefault(waiter.key, []).append(waiter)
    found: dict[str, KeyRow] = {}
    try:
        with settings.client(namespace=source.namespace) as client:
            wanted = [key] if key is not None else list(by_key)
            for each in wanted:  # waited on (or asked for): read even without a record (yet)
                state_of = client.status(Key(source.namespace, each))
                listed = state_of.status != "free" or state_of.attempts > 0  # as by a listing
                if each in by_key or listed:  # never seen (or removed): only when a task waits on it
                    found[each] = KeyRow.of(state_of, by_key.get(each, ()))
            if key is None and state != "waited-on":
                _page_in(client.store, source.namespace, found, state=state, name=name)
    except Exception as exc:  # shown to every reader of the page: never with the store's secrets
        source.error = hide_secrets(f"{type(exc).__name__}: {exc}", url_secrets(settings.store_url))
        return
    rows = [row for row in found.values() if _matches(row, state, name, key)]
    order = {status: i for i, status in enumerate(STATES)}
    rows.sort(key=lambda r: (order.get(r.status, len(order)), -len(r.waiters), r.name))
    source.truncated = len(rows) > MAX_ROWS
    source.rows = rows[:MAX_ROWS]


#: The statuses the page fills, without a name filter, with the newest records of the kind
#: :meth:`Store.latest <dibs.stores.base.Store.latest>` reads, not with the first in key order. Not
#: ``failed``: a failure stays beside the artifact a later attempt stores, so the newest failures may
#: all be of done keys, and reading past them would read the namespace's history.
NEWEST: dict[str, Literal["artifact", "failure"]] = {"done": "artifact"}


def _page_in(
    store: Store, namespace: str, found: dict[str, KeyRow], *, state: str | None, name: str | None
) -> None:
    """Add to ``found`` the keys of each status in the page's order (only ``state`` when given) until
    one more than :data:`MAX_ROWS` match the filters (the page then says there are more).

    Done keys, a namespace's history, come newest first (:meth:`Store.latest
    <dibs.stores.base.Store.latest>`): what a person looks for among a year of finished keys is what
    finished lately, and it is a read every store with an index answers without a scan (Azure's key
    order is the listing of every record blob). The other statuses come a page at a time in key
    order (:meth:`Store.list_page <dibs.stores.base.Store.list_page>`), as do done keys under a name
    filter, which is a search: the name is matched as the pages come."""
    matching = sum(1 for row in found.values() if _matches(row, state, name, None))
    for status in [state] if state else STATES:
        if matching > MAX_ROWS:
            return
        if status in NEWEST and name is None:
            matching += _newest_in(store, namespace, found, status, wanted=MAX_ROWS + 1 - matching)
            continue
        after: str | None = None
        while matching <= MAX_ROWS:
            page = store.list_page(namespace, state=status, after=after, limit=MAX_ROWS + 1)
            for listed in page.states:
                if listed.key.name in found:
                    continue
                row = found[listed.key.name] = KeyRow.of(listed, ())
                matching += _matches(row, state, name, None)
            if page.after is None:
                break
            after = page.after


def _newest_in(store: Store, namespace: str, found: dict[str, KeyRow], status: str, *, wanted: int) -> int:
    """Add to ``found`` the ``wanted`` keys of ``status`` whose artifact is newest; returns
    how many were added. A record with an artifact may be held (computed again), so a read that comes
    back full with too few is asked again for twice as many: bounded by the held keys, as every other
    record with an artifact is done."""
    limit, added = wanted, 0
    while True:
        newest = store.latest(namespace, NEWEST[status], limit=limit)
        for record in newest:
            if record.status == status and record.key.name not in found:
                found[record.key.name] = KeyRow.of(record, ())
                added += 1
        if added >= wanted or len(newest) < limit:
            return added
        limit *= 2
