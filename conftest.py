"""Plugins for every test of the repository (pytest loads this file first, whatever it runs).

- ``tests/prefect/harness.py``: one Prefect API server per session, shared by every test that needs one.
"""

pytest_plugins = ["tests.prefect.harness"]
