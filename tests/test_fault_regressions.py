"""Regression tests for violations the reliability suite (``reliability/``) found in the core.

Each test pins one finding with the smallest reproduction: a store that fails the way the fault proxy
made it fail (the reply of a write lost after the store acted, a store down when the client starts,
a connection dropped while the schema is created), and the behaviour the contract asks for.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy.exc as sa_exc

import dibs
from dibs.keys import Key
from dibs.records import ArtifactRecord, LeaseToken
from dibs.stores import NewArtifact
from dibs.stores.memory import MemoryStore
from tests.azurite import free_port


class ReplyLost(MemoryStore):
    """A store whose next ``complete`` fails after (``applied``) or before it took effect."""

    def __init__(self, *, applied: bool, failures: int = 1) -> None:
        super().__init__()
        self.applied = applied
        self.failures = failures
        self.completes = 0

    def complete(self, key: Key, token: LeaseToken, artifact: NewArtifact) -> ArtifactRecord:
        self.completes += 1
        if self.failures > 0:
            self.failures -= 1
            if self.applied:
                super().complete(key, token, artifact)
            raise dibs.StoreUnavailable("connection reset by peer")
        return super().complete(key, token, artifact)


class Unreachable(MemoryStore):
    """A store that answers the first acquire, then never again (a partition that does not heal)."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    def acquire(self, *args: Any, **kwargs: Any) -> Any:
        outcome = super().acquire(*args, **kwargs)
        self.down = True
        return outcome

    def read(self, key: Key) -> Any:
        if self.down:
            raise dibs.StoreUnavailable("no route to host")
        return super().read(key)

    def complete(self, *args: Any, **kwargs: Any) -> Any:
        raise dibs.StoreUnavailable("no route to host")


def test_a_complete_whose_reply_was_lost_is_recognised_as_stored() -> None:
    # Found under reset-mid-reply faults: the store had stored the artifact, the client reported
    # StoreUnavailable (and with policy "run" raised it), and the work was done again later.
    store = ReplyLost(applied=True)
    client = dibs.Reservations(store, ttl=5)
    report = client.compute("k", lambda: 42)
    assert (report.role, report.value, report.stored) == ("computed", 42, True)
    assert store.read(Key("default", "k")).artifact is not None
    assert store.completes == 1  # settled by reading, not by writing again


def test_a_complete_that_never_reached_the_store_is_sent_again() -> None:
    store = ReplyLost(applied=False, failures=2)
    client = dibs.Reservations(store, ttl=5)
    report = client.compute("k", lambda: 42)
    assert (report.value, report.stored) == (42, True)
    assert store.completes == 3


@pytest.mark.parametrize("policy", ["fail", "run"])
def test_a_complete_that_cannot_be_settled_follows_the_unavailable_policy(
    policy: str, caplog: pytest.LogCaptureFixture
) -> None:
    client = dibs.Reservations(Unreachable(), ttl=1.0, on_store_unavailable=policy)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="dibs"):
        if policy == "fail":
            with pytest.raises(dibs.StoreUnavailable, match="whether the artifact was stored is unknown"):
                client.compute("k", lambda: 42)
        else:
            report = client.compute("k", lambda: 42)
            assert (report.role, report.value, report.stored) == ("computed", 42, False)
    logged = [
        r for r in caplog.records if "default/k" in r.getMessage() and f"policy '{policy}'" in r.getMessage()
    ]
    assert logged, [r.getMessage() for r in caplog.records]


def test_policy_fail_is_logged_when_the_store_is_unavailable(caplog: pytest.LogCaptureFixture) -> None:
    class Down(MemoryStore):
        def acquire(self, *args: Any, **kwargs: Any) -> Any:
            raise dibs.StoreUnavailable("store down")

    with caplog.at_level(logging.ERROR, logger="dibs"), pytest.raises(dibs.StoreUnavailable):
        dibs.Reservations(Down()).compute("k", lambda: 1)
    assert any("default/k" in r.getMessage() and "policy 'fail'" in r.getMessage() for r in caplog.records)


@pytest.fixture
def closed_postgres_url() -> Iterator[str]:
    pytest.importorskip("psycopg")
    yield f"postgresql+psycopg://dibs:pw@127.0.0.1:{free_port()}/nowhere?connect_timeout=2"


def test_policy_run_is_kept_when_the_store_is_down_as_the_client_starts(
    closed_postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Found by the outage phase: opening the SQL store contacts the database, so with the database
    # down the constructor raised and policy "run" never got a say.
    with caplog.at_level(logging.WARNING, logger="dibs"):
        client = dibs.Reservations(closed_postgres_url, on_store_unavailable="run")
        report = client.compute("k", lambda: 7)
    assert (report.role, report.value, report.stored) == ("unreserved", 7, False)
    assert "pw" not in client.store.url
    assert any("policy 'run'" in r.getMessage() for r in caplog.records)
    with pytest.raises(dibs.StoreUnavailable):
        dibs.Reservations(closed_postgres_url).status("k")  # policy "fail" fails at the first call


def test_a_connection_dropped_while_creating_the_postgres_schema_is_store_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found under connection cuts: the advisory unlock in a ``finally`` ran on the dropped connection
    # and SQLAlchemy's PendingRollbackError replaced the StoreUnavailable.
    from dibs.stores.sql import SQLStore
    from dibs.stores.sql.schema import SchemaCheck
    from tests.backends import postgres

    def dropped(self: SchemaCheck, conn: Any) -> None:
        conn.invalidate()
        raise sa_exc.OperationalError(
            "CREATE TRIGGER",
            {},
            Exception("server closed the connection unexpectedly"),
            connection_invalidated=True,
        )

    with postgres.isolated_url(tmp_path) as url:
        monkeypatch.setattr(SchemaCheck, "_create_notify_trigger", dropped)
        with pytest.raises(dibs.StoreUnavailable, match="server closed the connection"):
            SQLStore(url).read(Key("k", "k"))  # the schema is created before the first operation


# -- hostile and bad input ---------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgres", "mysql"])
def sql_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    from tests.backends import mysql, postgres, sqlite

    backend = {"sqlite": sqlite, "postgres": postgres, "mysql": mysql}[request.param]
    with backend.isolated_url(tmp_path) as url:
        yield url


def _sql_row(store: Any, key: Key) -> dict[str, Any]:
    import sqlalchemy as sa

    with store.engine.connect() as conn:
        return dict(conn.execute(sa.select(store.t).where(store.t.c.key_hash == key.digest)).mappings().one())


def _sql_update(store: Any, key: Key, **values: Any) -> None:
    import sqlalchemy as sa

    with store.engine.begin() as conn:
        conn.execute(sa.update(store.t).where(store.t.c.key_hash == key.digest).values(**values))


def test_a_holder_cannot_complete_into_a_row_that_claims_another_key(sql_url: str) -> None:
    # Found by the corrupted-records cases: reads refused the foreign row, but the holder's complete
    # (one UPDATE matching key hash and token) wrote its artifact into it.
    client = dibs.Reservations(sql_url, namespace="foreign")
    got = client.get_or_reserve("k")
    assert isinstance(got, dibs.Acquired)
    key = client.key("k")
    _sql_update(client.store, key, namespace="other", name="someone-else")
    planted = _sql_row(client.store, key)
    with pytest.raises(dibs.CorruptRecord, match="belongs to key other/someone-else"):
        got.lease.complete("value")
    with pytest.raises(dibs.CorruptRecord):
        got.lease.release("failed")
    assert _sql_row(client.store, key) == planted


def test_a_lease_row_without_owner_is_corrupt_not_owned_by_none(sql_url: str) -> None:
    # Found by the corrupted-records cases: a NULL owner was read as the owner "None" (so waiters
    # waited on it), and the holder's complete turned it into an artifact produced by NULL.
    client = dibs.Reservations(sql_url, namespace="ownerless")
    got = client.get_or_reserve("k", owner="alice")
    assert isinstance(got, dibs.Acquired)
    key = client.key("k")
    _sql_update(client.store, key, owner=None)
    planted = _sql_row(client.store, key)
    with pytest.raises(dibs.CorruptRecord, match="owner is missing"):
        client.get_or_reserve("k", owner="bob")
    with pytest.raises(dibs.CorruptRecord):
        got.lease.complete("value")
    assert _sql_row(client.store, key) == planted


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("owner", None, "owner is missing"),
        ("lease_id", 12345, "lease_id is 12345, not a string"),
        ("fence", 1.5, "fence is 1.5, not an integer"),
        ("expires_at", "soon", "expires_at is 'soon'"),
        ("attempt", True, "attempt is True, not an integer"),
    ],
)
def test_a_record_document_with_a_field_of_the_wrong_type_is_corrupt(
    tmp_path: Path, field: str, value: Any, message: str
) -> None:
    # Found by the corrupted-records cases on the file and Azure stores: str(None), str(12345) and
    # int(1.5) turned damaged records into plausible leases, which dibs then acted on and rewrote.
    import json

    from dibs.stores.filesystem import FileStore

    store = FileStore(tmp_path / "store")
    client = dibs.Reservations(store, namespace="typed")
    got = client.get_or_reserve("k", owner="alice")
    assert isinstance(got, dibs.Acquired)
    path = store.record_path(client.key("k"))
    doc = json.loads(path.read_bytes())
    doc["lease"][field] = value
    path.write_text(json.dumps(doc))
    planted = path.read_bytes()
    with pytest.raises(dibs.CorruptRecord, match=message):
        client.get_or_reserve("k", owner="bob")
    with pytest.raises(dibs.CorruptRecord):
        got.lease.complete("value")
    assert path.read_bytes() == planted


def test_a_refused_pickle_signature_names_the_key() -> None:
    # Found by the hostile-pickle cases: the error said the signature was invalid, not where.
    store = MemoryStore()
    forged = dibs.Reservations(store, serializer="pickle", signing_key="attacker-key-0123456789")
    forged.run("k", lambda: {"x": 1})
    reader = dibs.Reservations(store, serializer="pickle", signing_key="the-readers-key-0123456789")
    with pytest.raises(dibs.ArtifactCorrupted, match=r"artifact of default/k: .*NOT unpickled") as caught:
        reader.get_or_reserve("k")
    assert caught.value.fields["key"] == "default/k"


def test_a_serializer_that_fails_with_its_own_error_gives_a_serialization_error_naming_the_key() -> None:
    class Fragile:
        name = "fragile"

        def dumps(self, value: Any) -> bytes:
            return b"x"

        def loads(self, payload: bytes) -> Any:
            raise ValueError("cannot parse")

    client = dibs.Reservations(MemoryStore(), serializer=Fragile())
    client.run("k", lambda: 1)
    with pytest.raises(dibs.SerializationError, match=r"artifact of default/k .*'fragile'.*cannot parse"):
        client.get_or_reserve("k")


def test_a_bad_port_in_a_sql_url_is_a_configuration_error_naming_it() -> None:
    # Found by the malformed-URL cases: SQLAlchemy's ValueError escaped (not a ReservationError).
    with pytest.raises(dibs.ConfigurationError, match="notaport") as caught:
        dibs.Reservations("postgresql+psycopg://user:s3cret@127.0.0.1:notaport/db")
    assert "s3cret" not in str(caught.value) and caught.value.__cause__ is None


def test_a_password_inside_a_url_in_the_query_is_redacted() -> None:
    # Found by the malformed-URL cases: an Azure error quoted account_url=https://user:pw@host.
    from dibs.stores import redact_url

    url = "azure://container?account_url=https://user:s3cret@a.blob.core.windows.net&timeout=3"
    assert (
        redact_url(url) == "azure://container?account_url=https://user:***@a.blob.core.windows.net&timeout=3"
    )


# -- PostgreSQL listening connections ------------------------------------------------------------------


def test_the_hub_listens_again_after_its_connection_is_cut(tmp_path: Path) -> None:
    # Found while measuring waits under connection cuts: a broken LISTEN connection made every wait
    # return at once. Now the hub notices, says it is not following (waiters poll meanwhile), opens a
    # new listening connection, reads every watched key again, and waiters are woken as before.
    import time

    import psycopg

    from dibs.runtime import runtime
    from tests.backends import postgres

    with postgres.isolated_url(tmp_path) as url:
        client = dibs.Reservations(url, namespace="cut", ttl=60)
        lease = client.get_or_reserve("k", owner="holder")
        assert isinstance(lease, dibs.Acquired)
        hub = runtime().hub(client.store)
        assert hub is not None
        with hub.subscribe(client.key("k")) as subscription:
            deadline = time.monotonic() + 30
            while not hub.following:
                assert time.monotonic() < deadline, "the hub never started listening"
                time.sleep(0.01)
            first = hub._feed._conn.info.backend_pid  # type: ignore[attr-defined]
            server = url.replace("postgresql+psycopg://", "postgresql://").split("?")[0]
            with psycopg.connect(server) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (first,))

            def listening_again() -> bool:
                conn = hub._feed._conn  # type: ignore[attr-defined]
                return hub.following and conn is not None and conn.info.backend_pid != first

            while not listening_again():
                assert time.monotonic() < deadline, "the hub never listened again"
                time.sleep(0.01)
            lease.lease.complete("after the cut")
            state = None
            while state is None or state.artifact is None:
                assert time.monotonic() < deadline, "the completion never reached the waiter"
                state = subscription.wait(1.0) or state
        client.close()


def test_a_waiter_polls_when_no_listening_connection_can_be_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by the full-size contention run: with the server out of connection slots, opening the
    # watch raised StoreUnavailable and failed the waiter's call, although the store itself answered.
    from dibs.stores.sql.feed import ListenFeed
    from tests.backends import postgres

    def refused(self: Any) -> None:
        raise dibs.StoreUnavailable("FATAL:  sorry, too many clients already")

    with postgres.isolated_url(tmp_path) as url:
        monkeypatch.setattr(ListenFeed, "open", refused)
        holder = dibs.Reservations(url, namespace="slots", ttl=30)
        got = holder.get_or_reserve("k", owner="holder")
        assert isinstance(got, dibs.Acquired)
        waiter = dibs.Reservations(url, namespace="slots", ttl=30)
        with pytest.raises(dibs.WaitTimeout):  # polled until its own timeout: not StoreUnavailable
            waiter.acquire("k", owner="waiter", timeout=0.5)
        got.lease.complete("polled")
        hit = waiter.acquire("k", owner="waiter", timeout=30)  # found by polling, without the hub
        assert isinstance(hit, dibs.Hit) and hit.value == "polled"


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg://user:s3cret@127.0.0.1:1/db?bogus_option=1",
        "mysql+pymysql://user:s3cret@127.0.0.1:1/db?bogus_option=1",
    ],
)
def test_an_option_the_sql_driver_rejects_is_a_configuration_error(url: str) -> None:
    # Found by the fuzzed URLs: psycopg's ProgrammingError and PyMySQL's TypeError escaped.
    pytest.importorskip("psycopg" if url.startswith("postgresql") else "pymysql")
    with pytest.raises(dibs.ConfigurationError, match="bogus_option") as caught:
        dibs.Reservations(url).status("k")
    assert "s3cret" not in str(caught.value)
