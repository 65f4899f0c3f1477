"""Plugins for every test of the repository (pytest loads this file first, whatever it runs).

- ``tests/prefect/harness.py``: one Prefect API server per session, shared by ``tests/prefect/`` and
  the Prefect snippets of the docs;
- ``tests/docs/plugin.py``: the code blocks of the README and ``docs/`` collected as tests (Sybil);
- ``tests/serial.py``: the ``serial`` marker on the multi-process scenarios, which ``scripts/test``
  runs one at a time after the rest has run in parallel;
- ``tests/redis_topologies.py``: the Redis Cluster and Sentinel set a test process shares, stopped
  when its session ends.
"""

pytest_plugins = ["tests.prefect.harness", "tests.docs.plugin", "tests.serial", "tests.redis_topologies"]
