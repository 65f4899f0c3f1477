"""A fresh key prefix on the Redis server named by ``DIBS_TEST_REDIS_URL``, deleted afterwards.

Tests never flush a database: every test writes under its own random prefix and removes exactly the
keys under it, so the suite can share a server (and a database) with anything else.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dibs.stores import redact_url
from tests.services import unavailable

URL_ENV = "DIBS_TEST_REDIS_URL"
_HOW = f"set {URL_ENV}=redis://127.0.0.1:6379/0 (a database the tests may write prefixed keys to)"


@contextmanager
def isolated_url(tmp_path: Path) -> Iterator[str]:
    base = os.environ.get(URL_ENV, "").strip()
    if not base:
        unavailable(f"the Redis store tests need a Redis server: {_HOW}")
    try:
        import redis
    except ImportError:
        unavailable("the Redis store tests need redis-py: pip install 'dibs[redis]'")
    if "prefix=" in base:
        unavailable(f"{URL_ENV} must not set 'prefix': each test chooses its own ({redact_url(base)})")
    client = redis.Redis.from_url(base, socket_connect_timeout=3, socket_timeout=10)
    try:
        client.ping()
    except redis.RedisError as exc:
        client.close()
        unavailable(f"no Redis answers PING at {redact_url(base)} ({exc}); start one or {_HOW}")
    prefix = f"dibs-test-{uuid.uuid4().hex}:"
    try:
        yield f"{base}{'&' if '?' in base else '?'}prefix={prefix}"
    finally:
        try:
            doomed = list(client.scan_iter(match=f"{prefix}*", count=500))
            for start in range(0, len(doomed), 500):
                client.delete(*doomed[start : start + 500])
        finally:
            client.close()
