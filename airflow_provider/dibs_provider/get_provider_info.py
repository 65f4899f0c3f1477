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
                "conn-fields": {
                    "store_url": {
                        "label": "Store URL",
                        "description": (
                            "Where leases and artifacts live, e.g. postgresql+psycopg://dibs@db/dibs, "
                            "redis://cache:6379/0, sqlite:////shared/dibs.db. Put the password in the "
                            "Password field, not here. Empty: DIBS_STORE_URL, then an embedded SQLite file."
                        ),
                        "schema": {"type": ["string", "null"], "format": "url"},
                    },
                    "payloads_url": {
                        "label": "Payload store URL",
                        "description": (
                            "Where results over 64 KiB go, apart from the store's records, e.g. "
                            "file:///shared/dibs or azure://container/prefix?account_url=...; the store "
                            "keeps a reference. Empty: DIBS_PAYLOADS_URL, else results stay in the records."
                        ),
                        "schema": {"type": ["string", "null"], "format": "url"},
                    },
                    "namespace": {
                        "label": "Namespace",
                        "description": "Dot-separated words (e.g. team.features); keys in different "
                        "namespaces never meet.",
                        "schema": {
                            "type": ["string", "null"],
                            "default": "default",
                            "pattern": rf"^{_WORD}(\.{_WORD})*$",
                        },
                    },
                    "ttl": {
                        "label": "Lease ttl (seconds)",
                        "description": "A crashed holder's lease is taken over this long after its last "
                        "heartbeat.",
                        "schema": {"type": ["number", "null"], "default": 60, "exclusiveMinimum": 0},
                    },
                    "heartbeat_interval": {
                        "label": "Heartbeat interval (seconds)",
                        "description": "How often a running task extends its lease; shorter than the ttl "
                        "(default: a third of it).",
                        "schema": {"type": ["number", "null"], "exclusiveMinimum": 0},
                    },
                    "wait_timeout": {
                        "label": "Wait timeout (seconds)",
                        "description": "How long a task waits for another run's lease before failing; "
                        "empty waits as long as the holder keeps its lease alive.",
                        "schema": {"type": ["number", "null"], "exclusiveMinimum": 0},
                    },
                    "max_lease_age": {
                        "label": "Maximum lease age (seconds)",
                        "description": "No lease lives longer than this, however often it heartbeats; "
                        "empty: no limit.",
                        "schema": {"type": ["number", "null"], "exclusiveMinimum": 0},
                    },
                    "max_age": {
                        "label": "Result maximum age (seconds)",
                        "description": "A stored result this old is computed again by the next run that "
                        "needs it; empty: results never expire.",
                        "schema": {"type": ["number", "null"], "exclusiveMinimum": 0},
                    },
                    "max_failures": {
                        "label": "Maximum failures",
                        "description": "After this many recorded failures a key is refused until "
                        "'dibs forget'; empty: try forever.",
                        "schema": {"type": ["integer", "null"], "minimum": 1},
                    },
                    "on_store_unavailable": {
                        "label": "When the store is unreachable",
                        "description": "'fail' (default) fails the task; 'run' runs the work unreserved "
                        "and logs it.",
                        "schema": {"type": ["string", "null"], "enum": ["fail", "run", None]},
                    },
                },
                "ui-field-behaviour": {
                    "hidden-fields": ["host", "port", "login", "schema", "extra"],
                    "relabeling": {"password": "Store password or secret"},
                    "placeholders": {"password": "optional; inserted into the store URL"},
                },
            }
        ],
    }
