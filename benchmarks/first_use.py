"""One fresh process's first reservation (run as a subprocess by :mod:`benchmarks.startup`).

Standalone on purpose: it imports nothing from the benchmarks, so the process pays for exactly what
a user's process pays for. Its one argument is a JSON object:

* ``pre``: what the orchestrator already imported before dibs is needed (``"prefect"``,
  ``"airflow"`` for ``airflow.sdk``, or ``"none"``); imported before the clock starts;
* ``url``, ``namespace``, ``key``: the reservation to make (``get_or_reserve``);
* ``raw``: instead of dibs, the raw baseline: connect with psycopg and run ``sql`` once with each
  of the two ``params`` (the raw primitive's claim of two fresh keys);
* ``together``: print ``ready``, read a start time (the shared monotonic clock) from stdin, and start
  then, so that several processes start at the same instant.

It prints one JSON line: seconds for ``import dibs`` (``import psycopg``), for opening the client
(which imports SQLAlchemy and the driver; psycopg: the connection), for the first request, in all,
and for a second reservation (warm); the CPU seconds until the first answer; the outcome; and the
monotonic times it started and had its first answer.
"""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    spec = json.loads(sys.argv[1])
    if spec["pre"] == "prefect":
        import prefect  # noqa: F401 - the orchestrator's imports, paid before the clock starts
    elif spec["pre"] == "airflow":
        import airflow.sdk  # noqa: F401
    if spec.get("together"):
        print("ready", flush=True)
        start_at = float(sys.stdin.readline())
        while time.monotonic() < start_at:
            pass
    started = time.monotonic()
    cpu_started = time.process_time()
    if spec.get("raw"):
        import psycopg

        imported = time.monotonic()
        with psycopg.connect(spec["raw"]["conninfo"], autocommit=True) as conn:
            opened = time.monotonic()
            conn.execute(spec["raw"]["sql"], spec["raw"]["params"][0])
            first = time.monotonic()
            cpu = time.process_time() - cpu_started
            conn.execute(spec["raw"]["sql"], spec["raw"]["params"][1])
            second = time.monotonic()
        outcome = "raw"
    else:
        import dibs

        imported = time.monotonic()
        client = dibs.Reservations(spec["url"], namespace=spec["namespace"], ttl=60)
        opened = time.monotonic()  # the store's driver and SQLAlchemy are imported by now
        got = client.get_or_reserve(spec["key"], owner=f"first-use-{spec.get('index', 0)}")
        first = time.monotonic()
        cpu = time.process_time() - cpu_started
        client.get_or_reserve(spec["key"] + "-second", owner="first-use")
        second = time.monotonic()
        outcome = type(got).__name__
        client.close()
    print(
        json.dumps(
            {
                "import_s": imported - started,
                "open_s": opened - imported,
                "request_s": first - opened,
                "first_s": first - started,
                "cpu_s": cpu,
                "second_s": second - first,
                "outcome": outcome,
                "started": started,
                "finished": first,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
