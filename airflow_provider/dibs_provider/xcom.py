"""A reserved task's large result in its XCom: a small reference, resolved through dibs.

With a payload store on the ``dibs`` connection (its ``payloads_url``), an artifact above the inline
limit lives in the payload store. When Airflow's XCom backend is :class:`DibsXComBackend` (and Airflow
does not look inside the value: no task mapped over it, no ``multiple_outputs``), its task (whether it
computed it, waited for it or found it) then returns, as its ``return_value`` XCom, a reference instead
of the value, so Airflow's metadata database never receives the payload (and a hit never loads it
into the worker: it only checks that the payload is there with its recorded size)::

    {"__dibs_artifact__": {"conn_id": "dibs_default", "namespace": "default", "name": "features",
                           "token": 3, "sha256": "...", "size": 104857600}}

The backend (``[core] xcom_backend = dibs_provider.xcom.DibsXComBackend``, or
``AIRFLOW__CORE__XCOM_BACKEND``) is Airflow's own one otherwise, and turns such a reference into the
value when a task pulls it, so TaskFlow arguments (``consume(produce())``) and ``xcom_pull`` receive the
value as without a payload store. Without it the task returns the value itself: a reference would reach
downstream tasks as a plain dict. :func:`resolve` reads a reference that reached a task some other way
(any other value is returned as it is).

Airflow resolves a downstream task's XCom arguments with the configured backend's
``deserialize_value`` and nothing else, which is why the transparent path needs the backend. The
value is read from the payload store and checked against the digest: a payload damaged since is
refused with :class:`~dibs.payloads.PayloadUnavailable` (never returned as a wrong value) and removed,
so that the upstream task, cleared, computes it again. If the key's artifact was replaced since (a
refresh) the reference names a payload the key no longer holds, and resolving it raises an error
saying so instead of handing over another value.
"""

from __future__ import annotations

import logging
from typing import Any

from dibs import ReservationError
from dibs.keys import Key
from dibs.payloads import PayloadDamaged, ReferencedArtifact, StoredPayload
from dibs.records import ArtifactRecord

log = logging.getLogger(__name__)

try:
    from airflow.sdk.bases.xcom import BaseXCom
except ImportError:  # pragma: no cover - Airflow 3.1
    from airflow.models.xcom import BaseXCom  # type: ignore[no-redef,attr-defined,unused-ignore]

__all__ = [
    "REFERENCE_FIELD",
    "DibsXComBackend",
    "backend_resolves_references",
    "is_reference",
    "reference",
    "resolve",
]

#: The one field of a reference document.
REFERENCE_FIELD = "__dibs_artifact__"


def reference(conn_id: str, key: Key, artifact: ArtifactRecord) -> dict[str, Any] | None:
    """The XCom that stands for ``artifact`` of ``key``, when it lives in a payload store (else ``None``:
    the value itself is the XCom)."""
    if not isinstance(artifact, ReferencedArtifact):
        return None
    return {
        REFERENCE_FIELD: {
            "conn_id": conn_id,
            "namespace": key.namespace,
            "name": key.name,
            "token": artifact.fence,
            "sha256": artifact.reference.sha256,
            "size": artifact.size,
        }
    }


def backend_resolves_references() -> bool:
    """Whether Airflow's configured XCom backend is :class:`DibsXComBackend` (``[core] xcom_backend``):
    only then does a reserved task return a reference, since only then does every downstream task get
    the value back (elsewhere it would get the reference, a dict, without a word)."""
    try:
        from airflow.sdk.execution_time.xcom import resolve_xcom_backend
    except ImportError:  # pragma: no cover - an Airflow without it: values are returned as they are
        return False
    try:
        backend = resolve_xcom_backend()  # type: ignore[no-untyped-call,unused-ignore]
    except Exception:  # a misconfigured backend is Airflow's to report, not ours
        return False
    return isinstance(backend, type) and issubclass(backend, DibsXComBackend)


def is_reference(value: Any) -> bool:
    """Whether ``value`` is a reserved task's reference to a payload (see the module docstring)."""
    if not isinstance(value, dict) or set(value) != {REFERENCE_FIELD}:
        return False
    return isinstance(value[REFERENCE_FIELD], dict)


def resolve(value: Any) -> Any:
    """The value a reserved task's XCom stands for: read through dibs if it is a reference."""
    if not is_reference(value):
        return value
    from dibs_provider.hooks.dibs import DibsHook

    ref = value[REFERENCE_FIELD]
    with DibsHook(ref["conn_id"], namespace=ref["namespace"]).get_client() as client:
        key = client.key(ref["name"])
        artifact = client.status(key).artifact
        if not isinstance(artifact, ReferencedArtifact) or artifact.reference.sha256 != ref["sha256"]:
            now = "no artifact" if artifact is None else f"the artifact of token {artifact.fence}"
            raise ReservationError(
                f"the XCom refers to the artifact of {key} stored under token {ref['token']} (SHA-256 "
                f"{ref['sha256']}), but the key now holds {now}: it was replaced or forgotten since. "
                "Clear the upstream task to compute it again",
                key=str(key),
            )
        before = _stat(artifact)
        try:
            return client.decode(key, artifact)
        except PayloadDamaged as exc:
            # The task that returned this reference checked only the payload's size (a hit never
            # loads it): a payload damaged at its size is found here. Removed (unless a writer put the
            # same digest since it was read: it is about to publish it), so that the next run of the
            # upstream task finds it missing and computes it again instead of handing it on.
            removed = before is not None and _remove_damaged(artifact, before.modified)
            then = "the damaged payload was removed" if removed else "the payload is damaged"
            raise PayloadDamaged(
                f"{exc.message}; {then}: clear the upstream task to compute it again", **exc.fields
            ) from None


def _stat(artifact: ReferencedArtifact) -> StoredPayload | None:
    """The payload as stored before it is read (``None`` if that cannot be told: then nothing is
    removed, whatever the read finds)."""
    try:
        return artifact.source.stat(artifact.reference.sha256)
    except Exception:
        return None


def _remove_damaged(artifact: ReferencedArtifact, read_since: float) -> bool:
    """Remove a payload found damaged, unless it changed after ``read_since``; a failure to remove it
    is logged, never raised over the damage it was about."""
    try:
        return artifact.source.delete(artifact.reference.sha256, unchanged_since=read_since + 1e-6) > 0
    except Exception as exc:
        log.warning("could not remove the damaged payload %s: %s", artifact.uri, exc)
        return False


class DibsXComBackend(BaseXCom):
    """Airflow's XCom backend, with reserved tasks' references resolved into their values on pull."""

    @staticmethod
    def deserialize_value(result: Any) -> Any:
        return resolve(BaseXCom.deserialize_value(result))
