"""``@task.reserved``: a TaskFlow task whose body runs once per key across DAG runs and DAGs.

::

    from airflow.sdk import dag, task

    @task.reserved(version="2")
    def build_features(day: str) -> dict:
        ...                                   # runs once per distinct ``day``, whichever DAG asks

    @task.reserved(key="features-{{ ds }}", ttl=120)
    def build_daily() -> dict: ...

The default key is ``qualname[@version]/<digest>``, the digest covering the function's code (the shape
of its source and what it closes over, never the DAG file's path or module) and its arguments
(:func:`dibs.keys.derive_key`), so two DAGs, two bundle versions or a plain Python caller running the
same function with the same arguments share one computation. ``key`` replaces it and is templated.
Everything else (hit, acquired, busy, deferral, outcomes) is
:class:`~dibs_provider.operators.reserved.ReservedOperatorMixin`.

Airflow registers the decorator from the provider info (``task-decorators``), so ``task.reserved`` exists
as soon as the ``dibs`` distribution is installed.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk.bases.decorator import DecoratedOperator, task_decorator_factory

from dibs_provider.hooks.dibs import DEFAULT_CONN_ID
from dibs_provider.operators.reserved import ReservedPythonOperator

if TYPE_CHECKING:
    from airflow.sdk import Context
    from airflow.sdk.bases.decorator import TaskDecorator

__all__ = ["reserved_task"]


class _ReservedDecoratedOperator(DecoratedOperator, ReservedPythonOperator):
    """The operator behind ``@task.reserved``; takes the decorator's short argument names.

    The short names (``key``, ``conn_id``...) are accepted here rather than translated in
    :func:`reserved_task` so that ``.override(key=...)`` and ``.partial(...)`` work too.
    """

    template_fields: Sequence[str] = ReservedPythonOperator.template_fields
    custom_operator_name: str = "@task.reserved"

    def __init__(
        self,
        *,
        python_callable: Callable[..., Any],
        op_args: Collection[Any] | None = None,
        op_kwargs: Mapping[str, Any] | None = None,
        key: str | None = None,
        conn_id: str = DEFAULT_CONN_ID,
        namespace: str | None = None,
        ttl: float | None = None,
        version: str | None = None,
        exclude: Sequence[str] = (),
        wait_timeout: float | None = None,
        deferrable: bool = True,
        max_age: float | None = None,
        refresh: bool | str = False,
        **kwargs: Any,
    ) -> None:
        # The callable and its arguments go both to the decorated operator and, through
        # ``kwargs_to_upstream``, to the PythonOperator side of the class, which runs them.
        callable_and_args: dict[str, Any] = {
            "python_callable": python_callable,
            "op_args": op_args,
            "op_kwargs": op_kwargs,
        }
        super().__init__(
            kwargs_to_upstream=callable_and_args,
            **callable_and_args,
            reservation_key=key,
            dibs_conn_id=conn_id,
            reservation_namespace=namespace,
            reservation_ttl=ttl,
            reservation_version=version,
            reservation_exclude=exclude,
            reservation_wait_timeout=wait_timeout,
            reservation_deferrable=deferrable,
            reservation_max_age=max_age,
            reservation_refresh=refresh,
            **kwargs,
        )

    def execute_complete(self, context: Context, event: object = None, **kwargs: Any) -> Any:
        # DecoratedOperator.execute post-processes return values (asset outlets); a resumed task does not
        # pass through execute, so do the same here.
        return self._handle_output(super().execute_complete(context, event, **kwargs))


def reserved_task(
    python_callable: Callable[..., Any] | None = None,
    multiple_outputs: bool | None = None,
    **kwargs: Any,
) -> TaskDecorator:
    """Wrap a function into a reserved task (``@task.reserved``).

    :param key: the key name (templated); default derived from the function and its arguments.
    :param conn_id: the ``dibs`` connection (default ``dibs_default``).
    :param namespace: overrides the connection's namespace.
    :param ttl: lease ttl in seconds; overrides the connection's.
    :param version: part of the derived key: bump it when the function's logic changes.
    :param exclude: parameter names left out of the derived key.
    :param wait_timeout: seconds to wait for another run's lease before failing.
    :param deferrable: defer while another run holds the key (default); ``False`` waits in the worker.
    :param max_age: seconds after which a stored result is too old and computed again.
    :param refresh: compute again even if a result is stored (templated, e.g. ``"{{ params.refresh }}"``).

    Other keyword arguments are the usual operator arguments (``retries``, ``pool``...).
    """
    return task_decorator_factory(
        python_callable=python_callable,
        multiple_outputs=multiple_outputs,
        decorated_operator_class=_ReservedDecoratedOperator,
        **kwargs,
    )
