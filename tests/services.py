"""Skips for absent services that CI turns into failures.

Locally a test that needs PostgreSQL, Redis or Azurite skips with the reason when the service is not
there; with ``DIBS_REQUIRE_SERVICES=1`` (set by ``.ci/run``) the same situation fails the test, so a
green CI run always means the real services were exercised.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

REQUIRE_ENV = "DIBS_REQUIRE_SERVICES"


def services_required() -> bool:
    return os.environ.get(REQUIRE_ENV, "").strip().lower() in {"1", "true", "yes"}


def unavailable(reason: str) -> NoReturn:
    """Skip (locally) or fail (under ``DIBS_REQUIRE_SERVICES=1``) because a service is missing."""
    if services_required():
        pytest.fail(f"{reason} (and {REQUIRE_ENV}=1 forbids skipping)", pytrace=False)
    pytest.skip(reason)


def full_size() -> bool:
    """``DIBS_FULL=1`` runs the slow scenarios at their documented full size instead of the CI size."""
    return os.environ.get("DIBS_FULL", "").strip() in {"1", "true", "yes"}
