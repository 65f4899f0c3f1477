"""What Airflow's ``ProvidersManager`` learns about this provider, without importing any of it.

Airflow calls :func:`get_provider_info` through the ``apache_airflow_provider`` entry point in
``pyproject.toml``. The connection form is described declaratively (``conn-fields`` and
``ui-field-behaviour``, Airflow >= 3.2) so the API server can render it without importing the hook;
older Airflow 3 versions fall back to :meth:`DibsHook.get_ui_field_behaviour`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["get_provider_info"]

_INTEGRATION = "dibs"
_WORD = r"[A-Za-z0-9_][A-Za-z0-9_-]{0,62}"  # one word of a namespace (dibs.keys)


def _field(label: str, description: str, kind: str, **rules: Any) -> dict[str, Any]:
    """One optional field of the connection form: a JSON schema ``kind`` (or null: empty means the
    default) with its ``rules``, which the form checks before saving."""
    return {"label": label, "description": description, "schema": {"type": [kind, "null"], **rules}}


def _conn_fields() -> dict[str, Any]:
    """The ``dibs`` connection's own fields (its ``extra``), as the form shows and checks them; every
    duration is a number of seconds greater than 0. A fresh dict each call: Airflow may keep it."""
    return {
        "store_url": _field(
            "Store URL",
            "Where leases and artifacts live, e.g. postgresql+psycopg://dibs@db/dibs, "
            "redis://cache:6379/0, sqlite:////shared/dibs.db. Put the password in the "
            "Password field, not here. Empty: DIBS_STORE_URL, then an embedded SQLite file.",
            "string",
            format="url",
        ),
        "payloads_url": _field(
            "Payload store URL",
            "Where results over 64 KiB go, apart from the store's records, e.g. "
            "file:///shared/dibs or azure://container/prefix?account_url=...; the store "
            "keeps a reference. Empty: DIBS_PAYLOADS_URL, else results stay in the records.",
            "string",
            format="url",
        ),
        "namespace": _field(
            "Namespace",
            "Dot-separated words (e.g. team.features); keys in different namespaces never meet.",
            "string",
            default="default",
            pattern=rf"^{_WORD}(\.{_WORD})*$",
        ),
        "ttl": _field(
            "Lease ttl (seconds)",
            "A crashed holder's lease is taken over this long after its last heartbeat.",
            "number",
            default=60,
            exclusiveMinimum=0,
        ),
        "heartbeat_interval": _field(
            "Heartbeat interval (seconds)",
            "How often a running task extends its lease; shorter than the ttl (default: a third of it).",
            "number",
            exclusiveMinimum=0,
        ),
        "wait_timeout": _field(
            "Wait timeout (seconds)",
            "How long a task waits for another run's lease before failing; "
            "empty waits as long as the holder keeps its lease alive.",
            "number",
            exclusiveMinimum=0,
        ),
        "max_lease_age": _field(
            "Maximum lease age (seconds)",
            "No lease lives longer than this, however often it heartbeats; empty: no limit.",
            "number",
            exclusiveMinimum=0,
        ),
        "max_age": _field(
            "Result maximum age (seconds)",
            "A stored result this old is computed again by the next run that needs it; "
            "empty: results never expire.",
            "number",
            exclusiveMinimum=0,
        ),
        "max_failures": _field(
            "Maximum failures",
            "After this many recorded failures a key is refused until 'dibs forget'; empty: try forever.",
            "integer",
            minimum=1,
        ),
        "on_store_unavailable": _field(
            "When the store is unreachable",
            "'fail' (default) fails the task; 'run' runs the work unreserved and logs it.",
            "string",
            enum=["fail", "run", None],
        ),
        "outage_patience": _field(
            "Outage patience (seconds)",
            "How long a waiting task keeps waiting while the store is unreachable; empty: 60 (a managed "
            "database's failover).",
            "number",
            exclusiveMinimum=0,
        ),
    }


def get_provider_info() -> dict[str, Any]:
    # ``package-name`` must be the *distribution* name: Airflow checks it against the installed
    # distribution that declared the entry point, and that distribution is ``dibs``.
    return {
        "package-name": "dibs",
        "name": "dibs",
        "description": (
            "Leases on cache keys, so identical expensive tasks compute once across DAG runs, DAGs "
            "and processes: ``@task.reserved``, a reserved operator wrapper, a sensor and a trigger."
        ),
        "integrations": [
            {
                "integration-name": _INTEGRATION,
                "external-doc-url": "https://github.com/dibs-dev/dibs#readme",
                "tags": ["software"],
            }
        ],
        "hooks": [{"integration-name": _INTEGRATION, "python-modules": ["dibs_provider.hooks.dibs"]}],
        "operators": [
            {"integration-name": _INTEGRATION, "python-modules": ["dibs_provider.operators.reserved"]}
        ],
        "sensors": [
            {"integration-name": _INTEGRATION, "python-modules": ["dibs_provider.sensors.reservation"]}
        ],
        "triggers": [
            {"integration-name": _INTEGRATION, "python-modules": ["dibs_provider.triggers.reservation"]}
        ],
        "extra-links": ["dibs_provider.links.reservation.ReservationLink"],
        "plugins": [
            {"name": "dibs", "plugin-class": "dibs_provider.plugins.reservations.DibsReservationsPlugin"}
        ],
        "task-decorators": [
            {"name": "reserved", "class-name": "dibs_provider.decorators.reserved.reserved_task"}
        ],
        "connection-types": [
            {
                "connection-type": "dibs",
                "hook-class-name": "dibs_provider.hooks.dibs.DibsHook",
                "hook-name": "dibs (task reservations)",
                "conn-fields": _conn_fields(),
                "ui-field-behaviour": {
                    "hidden-fields": ["host", "port", "login", "schema", "extra"],
                    "relabeling": {"password": "Store password or secret"},
                    "placeholders": {"password": "optional; inserted into the store URL"},
                },
            }
        ],
    }
