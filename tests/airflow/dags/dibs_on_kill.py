"""A DAG whose reserved task holds its key until Airflow kills it (tests/airflow/test_integration.py).

The work is a reserved ``BashOperator`` that signals it started (a file in ``DIBS_IT_DIR``), then
sleeps far longer than any test: only a kill ends it. Its lease ttl is long too, so a waiter that gets
the key during the test got it because ``on_kill`` released it, not because it expired.
"""

from __future__ import annotations

import datetime as dt

from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG

from dibs_provider.operators.reserved import reserved_operator

with DAG("dibs_on_kill", schedule=None, start_date=dt.datetime(2024, 1, 1), catchup=False):
    reserved_operator(BashOperator)(
        task_id="hold_until_killed",
        bash_command='touch "$DIBS_IT_DIR/started" && sleep 600',
        reservation_key="held-until-killed",
        reservation_ttl=600,
        retries=0,
    )
