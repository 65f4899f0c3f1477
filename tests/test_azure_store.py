"""What is specific to the Azure Blob store; the shared behaviour is in ``tests/contract``.

Covered here: ETag compare-and-swap races between real OS processes, URL parsing and the order in
which credentials are chosen, secrets kept out of URLs, errors and logs, the service's clock (the
``Date`` header, refined) instead of this machine's, foreign or damaged blobs reported and left as
they were, tampered payloads caught, a write whose response was lost, and an emulator restart in the
middle of a lease. Runs against Azurite (``scripts/install-azurite.sh``); skips without it, fails
under ``DIBS_REQUIRE_SERVICES=1``. The offline tests at the top need no emulator.
"""

from __future__ import annotations

import asyncio
import dataclasses
import email.utils
import json
import logging
import multiprocessing
import queue
import random
import re
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import quote

import pytest

from dibs.stores import AcquireRequest, NewArtifact

pytest.importorskip("azure.storage.blob")

import requests
from azure.core.exceptions import ResourceExistsError, ServiceRequestError, ServiceResponseError
from azure.core.pipeline.transport import RequestsTransport
from azure.storage.blob import BlobServiceClient, ContainerClient

from dibs import Reservations
from dibs.errors import ArtifactCorrupted, ConfigurationError, CorruptRecord, LeaseLost, StoreUnavailable
from dibs.keys import Key
from dibs.records import Granted, Held, LeaseRecord, Present, checksum
from dibs.stores import open_store
from dibs.stores.azure import CONNECTION_STRING_ENV, AzureBlobStore, ServiceClock, connect, parse_url
from dibs.stores.azure import connection as azure_connection
from dibs.stores.azure.connection import client_defaults
from dibs.stores.azure.index import Layout
from dibs.testing.contract import opened_stores
from tests import azurite
from tests.backends import azure as backend
from tests.services import unavailable

SPAWN = multiprocessing.get_context("spawn")
KEY = Key("azure.tests", "the key")
GENEROUS = 120.0  # seconds; a healthy run never comes near it
ACCOUNT_URL = "https://myaccount.blob.core.windows.net"
# Look like real secrets (valid base64, SAS syntax) so that they pass validation and reach the SDK.
SECRET_KEY = "U2VjcmV0S2V5VGhhdE11c3ROZXZlckxlYWs+Pz8/c2VjcmV0a2V5MTIzNDU2Nzg5MA=="
SECRET_SIG = "c2lnLXRoYXQtbXVzdC1uZXZlci1sZWFr"
SECRET_SAS = f"sv=2024-11-04&ss=b&srt=co&sp=rwdlac&se=2099-01-01T00:00:00Z&sig={SECRET_SIG}"


def _granted(outcome: object) -> LeaseRecord:
    assert isinstance(outcome, Granted), outcome
    return outcome.lease


def _complete(store: AzureBlobStore, lease: LeaseRecord, payload: bytes) -> None:
    store.complete(lease.key, lease.token, NewArtifact("bytes", payload, checksum(payload)))


def _assert_no_secret(text: str, *secrets: str) -> None:
    for secret in secrets:
        assert secret not in text
        assert quote(secret, safe="") not in text


# --------------------------------------------------------------------------------------------------
# Offline: URLs, credentials, the clock


@pytest.mark.parametrize(
    ("url", "container", "prefix", "timeout", "retries"),
    [
        (f"azure://cache?account_url={ACCOUNT_URL}", "cache", "", 30.0, 3),
        (f"azure://cache/?account_url={ACCOUNT_URL}/", "cache", "", 30.0, 3),
        (f"azure://team-cache/dibs/prod?account_url={ACCOUNT_URL}&timeout=5&retries=0", "team-cache",
         "dibs/prod/", 5.0, 0),
        (f"azure://abc/a.b/c_d/e-f/v=1?account_url={ACCOUNT_URL}", "abc", "a.b/c_d/e-f/v=1/", 30.0, 3),
    ],
)  # fmt: skip
def test_urls_in_the_documented_forms_parse(
    url: str, container: str, prefix: str, timeout: float, retries: int
) -> None:
    settings = parse_url(url)
    assert (settings.container, settings.prefix, settings.timeout, settings.retries) == (
        container,
        prefix,
        timeout,
        retries,
    )
    assert settings.account_url == ACCOUNT_URL


def test_unencoded_secret_values_keep_their_plus_signs() -> None:
    # Account keys are base64: a '+' in them is not a space, even when the user did not encode it.
    settings = parse_url(f"azure://cache?account_url={ACCOUNT_URL}&account_key={SECRET_KEY}")
    assert settings.account_key == SECRET_KEY
    encoded = parse_url(
        f"azure://cache?account_url={ACCOUNT_URL}&sas_token={quote('?' + SECRET_SAS, safe='')}"
    )
    assert encoded.sas_token == SECRET_SAS


GOOD = "azure://cache?account_url=https://a.blob.core.windows.net"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("azure:/cache", "does not start with 'azure://'"),
        ("s3://cache/prefix", "does not start with 'azure://'"),
        ("azure://?account_url=https://a.blob.core.windows.net", "container name is missing"),
        (GOOD.replace("cache", "Cache"), "'Cache' is not a valid container name"),
        ("azure://ab?account_url=https://a.blob.core.windows.net", "'ab' is not a valid container name"),
        ("azure://a--b?account_url=https://a.blob.core.windows.net", "'a--b' is not a valid container"),
        ("azure://cache/../etc?account_url=https://a.blob.core.windows.net", "prefix segment '..'"),
        ("azure://cache/a//b?account_url=https://a.blob.core.windows.net", "prefix segment ''"),
        ("azure://cache/a%2F..%2Fb?account_url=https://a.blob.core.windows.net", "prefix segment '..'"),
        ("azure://cache/sp ace?account_url=https://a.blob.core.windows.net", "prefix segment 'sp ace'"),
        ("azure://cache?account_url=ftp://a.blob.core.windows.net", "must be an http(s) URL"),
        ("azure://cache?account_url=https://a.blob.core.windows.net/?sig=x", "must not carry a query"),
        (GOOD + "&timeout=soon", "timeout='soon' is not a number"),
        (GOOD + "&timeout=0", "timeout='0' must be between"),
        (GOOD + "&retries=1.5", "retries='1.5' is not a whole"),
        (GOOD + "&max_concurrency=0", "must be between 1"),
        (GOOD + "&acount_key=abc", "unknown parameter"),
        (GOOD + "&sas_token=sv=1&sig=x", "unencoded SAS"),
        (GOOD + "&account_key=not*base64", "not valid base64"),
        ("azure://cache?account_key=" + SECRET_KEY, "need account_url"),
        (GOOD + "&account_url=https://b", "given twice"),
        ("azure://cache?connection_string=", "'connection_string' is empty"),
        ("azure://cache#frag", "contains '#'"),
    ],
)  # fmt: skip
def test_bad_urls_are_named_with_an_example_of_a_good_one(url: str, says: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        parse_url(url)
    message = str(caught.value)
    assert says in message
    assert (
        "azure://my-container/optional/prefix?account_url=https://myaccount.blob.core.windows.net" in message
    )
    assert "azure:" in message.split("expected", 1)[0] or "'s3://" in message  # the value itself is named
    _assert_no_secret(message, SECRET_KEY, "not*base64")


def test_secrets_in_bad_urls_stay_out_of_the_error() -> None:
    bad = f"azure://cache?account_url={ACCOUNT_URL}&account_key={SECRET_KEY}&connection_string=x&bogus=1"
    with pytest.raises(ConfigurationError) as caught:
        open_store(bad)
    _assert_no_secret(str(caught.value), SECRET_KEY)
    _assert_no_secret("".join(traceback.format_exception(caught.value)), SECRET_KEY)


def _source(url: str, environ: dict[str, str]) -> str:
    connection = connect(parse_url(url), environ)
    try:
        return connection.source
    finally:
        connection.service.close()
        if connection.owned_credential is not None:
            connection.owned_credential.close()


def test_credentials_are_taken_in_the_documented_order() -> None:
    dev = azurite.connection_string("http://127.0.0.1:10000/devstoreaccount1")
    env = {CONNECTION_STRING_ENV: dev}
    in_url = f"connection_string={quote(dev, safe='')}"
    dev_endpoint = "http://127.0.0.1:10000/devstoreaccount1"
    assert _source(f"azure://cache?{in_url}", env) == "connection string"
    assert _source(f"azure://cache?account_url={ACCOUNT_URL}&account_key={SECRET_KEY}", env) == "account key"
    sas = quote(SECRET_SAS, safe="")
    assert _source(f"azure://cache?account_url={ACCOUNT_URL}&sas_token={sas}", env) == "SAS token"
    assert _source("azure://cache", env) == f"${CONNECTION_STRING_ENV}"
    assert _source(f"azure://cache?account_url={dev_endpoint}", env) == f"${CONNECTION_STRING_ENV}"
    pytest.importorskip("azure.identity")
    # Constructing DefaultAzureCredential contacts nothing; no token is requested in this test.
    assert _source(f"azure://cache?account_url={ACCOUNT_URL}", {}) == "DefaultAzureCredential"


class _RecordingClient(BlobServiceClient):  # type: ignore[misc]
    """The SDK's client, keeping the options each one was built with (no request is sent)."""

    built: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.built.append(kwargs)
        super().__init__(*args, **kwargs)


def _built_with(monkeypatch: pytest.MonkeyPatch, url: str, **client_options: Any) -> dict[str, Any]:
    """The options ``connect`` gave the SDK's client for ``url`` (closed at once)."""
    monkeypatch.setattr(azure_connection, "BlobServiceClient", _RecordingClient)
    _RecordingClient.built.clear()
    connect(parse_url(url), {}, client_options).service.close()
    (options,) = _RecordingClient.built
    return options


def _pool_size(session: requests.Session) -> int:
    return int(session.get_adapter(ACCOUNT_URL).poolmanager.connection_pool_kw["maxsize"])


def test_a_max_concurrency_above_requests_pool_gets_a_pool_that_wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """Above requests' 10 connections a host, the client keeps ``max_concurrency`` and 10 more (the
    rest of what it carries meanwhile), so a removal at full width does not drop connections; the
    session follows ``use_env_settings`` as the SDK's own does; a caller's transport or session wins."""
    url = f"azure://cache?account_url={ACCOUNT_URL}&account_key={SECRET_KEY}"
    assert "session" not in _built_with(monkeypatch, url)  # the default (4): the SDK's own session
    assert "session" not in _built_with(monkeypatch, f"{url}&max_concurrency=10")
    wide = _built_with(monkeypatch, f"{url}&max_concurrency=16")["session"]
    assert _pool_size(wide) == 26 and wide.trust_env
    assert not _built_with(monkeypatch, f"{url}&max_concurrency=16", use_env_settings=False)[
        "session"
    ].trust_env
    transport = RequestsTransport()
    assert "session" not in _built_with(monkeypatch, f"{url}&max_concurrency=16", transport=transport)
    own = requests.Session()
    assert _built_with(monkeypatch, f"{url}&max_concurrency=16", session=own)["session"] is own


def test_an_environment_connection_string_for_another_account_is_refused() -> None:
    env = {CONNECTION_STRING_ENV: azurite.connection_string("http://127.0.0.1:10000/devstoreaccount1")}
    with pytest.raises(
        ConfigurationError, match=r"names the endpoint .* but the URL's account_url"
    ) as caught:
        connect(parse_url(f"azure://cache?account_url={ACCOUNT_URL}"), env)
    _assert_no_secret(str(caught.value), azurite.DEV_KEY)


def test_a_malformed_connection_string_is_a_configuration_error_without_its_value() -> None:
    broken = f"DefaultEndpointsProtocol=https;AccountKey={SECRET_KEY}"  # no account, no endpoint
    with pytest.raises(ConfigurationError, match="connection string from the URL") as caught:
        connect(parse_url(f"azure://cache?connection_string={quote(broken, safe='')}"), {})
    _assert_no_secret(str(caught.value), SECRET_KEY, broken)


def test_without_any_credential_or_azure_identity_the_error_says_what_to_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "azure.identity", None)  # as if azure-identity were not installed
    with pytest.raises(ConfigurationError, match="install azure-identity"):
        connect(parse_url(f"azure://cache?account_url={ACCOUNT_URL}"), {})
    with pytest.raises(ConfigurationError, match="no Azure account"):
        connect(parse_url("azure://cache"), {})


def test_default_credential_needs_https() -> None:
    pytest.importorskip("azure.identity")
    with pytest.raises(ConfigurationError, match="only supported with HTTPS"):
        connect(parse_url("azure://cache?account_url=http://127.0.0.1:10000/devstoreaccount1"), {})


def test_a_token_credential_that_finds_nothing_is_a_configuration_error() -> None:
    identity = pytest.importorskip("azure.identity")

    class NoCredential:
        """What DefaultAzureCredential does on a machine without any identity (without probing one)."""

        def get_token(self, *scopes: str, **kwargs: Any) -> Any:
            raise identity.CredentialUnavailableError("no identity here")

        def get_token_info(self, *scopes: str, **kwargs: Any) -> Any:
            return self.get_token(*scopes)

    # Never contacted: the token is refused before any request is sent (and not asked for again).
    settings = parse_url("azure://cache?account_url=https://127.0.0.1:9/devstoreaccount1")
    service = BlobServiceClient(settings.account_url, credential=NoCredential(), **client_defaults(settings))
    store = AzureBlobStore(service, "cache", credential_source="DefaultAzureCredential")
    with store, pytest.raises(ConfigurationError, match="no Azure credential found") as caught:
        store.read(KEY)
    assert "az login" in str(caught.value)


def test_the_store_url_carries_no_credential(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CONNECTION_STRING_ENV, raising=False)
    sas = quote(SECRET_SAS, safe="")
    for url in (
        f"azure://cache/p?account_url={ACCOUNT_URL}&account_key={SECRET_KEY}&retries=1",
        f"azure://cache/p?account_url={ACCOUNT_URL}&sas_token={sas}",
        "azure://cache/p?connection_string="
        + quote(azurite.connection_string("http://127.0.0.1:1/x"), safe=""),
    ):
        with AzureBlobStore.from_url(url) as store:
            for shown in (store.url, repr(store)):
                _assert_no_secret(shown, SECRET_KEY, SECRET_SIG, azurite.DEV_KEY)
            assert store.url.startswith("azure://cache/p?account_url=http")
    with AzureBlobStore.from_url(
        f"azure://cache/p?account_url={ACCOUNT_URL}&account_key={SECRET_KEY}"
    ) as store:
        assert store.url == f"azure://cache/p?account_url={ACCOUNT_URL}"
        assert parse_url(store.url).prefix == "p/"  # the URL reopens the same place


def test_the_service_clock_refines_the_date_header_without_leaving_its_second() -> None:
    # A service 1234.3 s ahead of this process's monotonic clock, 10 ms round trips, requests at
    # irregular (seeded) intervals; each Date header is the service's time truncated to the second.
    clock, offset, rng = ServiceClock(), 1234.3, random.Random(7)
    sent, errors = 100.0, []
    for _ in range(100):
        sent += rng.uniform(0.05, 0.6)
        served_at = sent + 0.005 + offset
        date = float(int(served_at))
        now = clock.observe(date, sent, sent + 0.01)
        assert date <= now < date + 1  # never further from the truth than the header itself
        errors.append(abs(now - served_at))
    assert max(errors[30:]) < 0.02  # a few second boundaries later, about as good as the round trip


def test_the_service_clock_does_not_go_backwards_and_recovers_from_a_step() -> None:
    clock = ServiceClock()
    seen = [clock.observe(float(int(1000.0 + t)), t, t + 0.01) for t in (0.0, 0.2, 0.5, 0.9, 1.3)]
    assert seen == sorted(seen)
    stepped = clock.observe(5000.0, 2.0, 2.01)  # the service's clock jumped: follow the header
    assert 5000.0 <= stepped < 5001.0


# --------------------------------------------------------------------------------------------------
# Against Azurite


@pytest.fixture
def azure_url(tmp_path: Path) -> Iterator[str]:
    with backend.isolated_url(tmp_path) as url:
        yield url


@pytest.fixture
def open_azure(azure_url: str) -> Iterator[Callable[[], AzureBlobStore]]:
    with opened_stores(lambda: AzureBlobStore.from_url(azure_url)) as opener:
        yield opener


@pytest.fixture
def store(open_azure: Callable[[], AzureBlobStore]) -> AzureBlobStore:
    return open_azure()


@pytest.fixture
def raw(azure_url: str) -> Iterator[ContainerClient]:
    """A plain SDK client on the test's container, to look under the store."""
    settings = parse_url(azure_url)
    assert settings.connection_string is not None
    with BlobServiceClient.from_connection_string(settings.connection_string) as service:
        yield service.get_container_client(settings.container)


@dataclasses.dataclass(frozen=True)
class _Race:
    url: str
    keys: list[str]
    shared: dict[str, Any] | None = None  # a handed-off lease that every worker completes


def _race_worker(race: _Race, worker: int, barrier: Any, results: Any) -> None:
    """Acquire every key as ``worker-N`` once all racers are lined up; report each outcome."""
    url, shared = race.url, race.shared
    keys = race.keys[worker % len(race.keys) :] + race.keys[: worker % len(race.keys)]
    from dibs.records import LeaseToken

    with AzureBlobStore.from_url(url) as store:
        store.read(Key("azure.race", "warm-up"))  # connect before the start line
        barrier.wait(timeout=GENEROUS)
        report: list[tuple[str, str, str, int]] = []
        if shared is None:
            for name in keys:
                outcome = store.acquire(Key("azure.race", name), AcquireRequest(f"worker-{worker}", 60))
                assert isinstance(outcome, Granted | Held), outcome
                report.append((name, type(outcome).__name__, outcome.lease.owner, outcome.lease.token.fence))
        else:  # every worker holds the same handed-off lease and completes it with its own payload
            token = LeaseToken(shared["fence"], shared["lease_id"])
            payload = f"payload of worker {worker}".encode()
            try:
                store.complete(
                    Key("azure.race", shared["key"]), token, NewArtifact("bytes", payload, checksum(payload))
                )
                report.append((shared["key"], "completed", f"worker-{worker}", token.fence))
            except LeaseLost:
                report.append((shared["key"], "LeaseLost", f"worker-{worker}", token.fence))
        results.put((worker, report))


def _run_racers(url: str, processes: int, keys: list[str], shared: dict[str, Any] | None = None) -> list[Any]:
    barrier, results = SPAWN.Barrier(processes), SPAWN.Queue()
    children = [
        SPAWN.Process(
            target=_race_worker,
            # each worker walks the keys in its own order, so that collisions happen all along the way
            args=(_Race(url, keys, shared), w, barrier, results),
        )
        for w in range(processes)
    ]
    for child in children:
        child.start()
    reports: list[Any] = []
    deadline = time.monotonic() + GENEROUS
    try:
        while len(reports) < processes:
            try:
                reports.append(results.get(timeout=0.5))
            except queue.Empty:
                crashed = [child.exitcode for child in children if child.exitcode not in (None, 0)]
                assert not crashed, f"a racing worker died with exit code {crashed[0]}"
                assert time.monotonic() < deadline, "the racing workers did not report back"
    finally:
        for child in children:
            child.join(timeout=GENEROUS)
            if child.is_alive():
                child.kill()
    assert [child.exitcode for child in children] == [0] * processes
    return reports


def test_racing_processes_get_exactly_one_grant_per_key(azure_url: str) -> None:
    processes, keys = 6, [f"partition-{i:02d}" for i in range(24)]
    reports = _run_racers(azure_url, processes, keys)
    by_key: dict[str, list[tuple[str, str, int]]] = {name: [] for name in keys}
    for _worker, report in reports:
        for name, kind, owner, fence in report:
            by_key[name].append((kind, owner, fence))
    for name, outcomes in by_key.items():
        assert len(outcomes) == processes
        winners = [owner for kind, owner, _ in outcomes if kind == "Granted"]
        assert len(winners) == 1, f"{name}: granted to {winners}"
        # Everyone else saw the winner's lease, with the first fence.
        assert {(owner, fence) for _, owner, fence in outcomes} == {(winners[0], 1)}


def test_racing_completions_of_one_handed_off_lease_store_exactly_one_payload(
    azure_url: str, store: AzureBlobStore, raw: ContainerClient
) -> None:
    key = Key("azure.race", "handed-off")
    lease = _granted(store.acquire(key, AcquireRequest("scheduler", 60)))
    shared = {"key": key.name, "fence": lease.token.fence, "lease_id": lease.token.lease_id}
    reports = _run_racers(azure_url, 5, [key.name], shared)
    kinds = sorted(kind for _, report in reports for _, kind, _, _ in report)
    assert kinds == ["LeaseLost"] * 4 + ["completed"]
    (winner,) = [owner for _, report in reports for _, kind, owner, _ in report if kind == "completed"]
    artifact = store.read(key).artifact
    assert artifact is not None
    assert artifact.verified_payload(key) == f"payload of worker {winner.split('-')[1]}".encode()
    # The losers removed their uploads: only the winner's payload blob is left.
    assert [b.name for b in raw.list_blobs(name_starts_with=f"{store.prefix}artifacts/")] == [
        store.artifact_name(key, artifact)
    ]


def test_blob_names_come_from_the_key_digest_only(store: AzureBlobStore, raw: ContainerClient) -> None:
    key = Key("azure.names", "../../../etc/passwd")
    _complete(store, _granted(store.acquire(key, AcquireRequest("alice", 60))), b"x")
    names = sorted(b.name for b in raw.list_blobs())
    artifact = store.read(key).artifact
    assert artifact is not None
    layout = Layout(store.prefix)  # the index's names (.index), and its marker, written with the container
    made = layout.made("artifact", key, artifact.created_at)
    assert names == sorted([store.record_name(key), store.artifact_name(key, artifact), made, layout.ready])
    for name in names:
        assert name.startswith("dibs/test/") and "passwd" not in name and "azure.names" not in name
        assert key.digest in name or name == layout.ready  # the index names its namespace by a digest


def test_now_is_the_services_time_not_this_machines(
    store: AzureBlobStore, raw: ContainerClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = _head_date(raw)
    monkeypatch.setattr(time, "time", lambda: 86_400.0)  # this machine now believes it is 2 Jan 1970
    state = store.read(KEY)
    monkeypatch.undo()
    after = _head_date(raw)
    assert before <= state.now < after + 1
    lease = _granted(store.acquire(KEY, AcquireRequest("alice", 30)))
    assert lease.acquired_at >= state.now


def _head_date(raw: ContainerClient) -> float:
    seen: list[str] = []
    raw.exists(raw_response_hook=lambda response: seen.append(response.http_response.headers["Date"]))
    return email.utils.parsedate_to_datetime(seen[-1]).timestamp()


@pytest.mark.parametrize(
    "content",
    [
        b"\x00\xffnot json at all",
        b'{"format": "somebody-else/3", "namespace": "azure.tests", "name": "the key"}',
        b"[1, 2, 3]",
        b"",
    ],
)
def test_a_foreign_record_is_reported_and_left_untouched(
    store: AzureBlobStore, raw: ContainerClient, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    blob = raw.get_blob_client(store.record_name(KEY))
    raw.create_container()
    blob.upload_blob(content)
    etag = blob.get_blob_properties().etag
    for operation in (
        lambda: store.read(KEY),
        lambda: store.acquire(KEY, AcquireRequest("alice", 60)),
        lambda: store.force_release(KEY),
        lambda: store.forget(KEY),
    ):
        with pytest.raises(CorruptRecord, match="left untouched") as caught:
            operation()
        assert store.record_name(KEY) in str(caught.value)
    assert blob.download_blob().readall() == content
    assert blob.get_blob_properties().etag == etag
    with caplog.at_level(logging.WARNING, logger="dibs"):
        assert list(store.list()) == []
    assert store.record_name(KEY) in caplog.text


def test_a_record_copied_to_another_keys_name_is_foreign(store: AzureBlobStore, raw: ContainerClient) -> None:
    other = Key("azure.tests", "another key")
    _granted(store.acquire(other, AcquireRequest("alice", 60)))
    copy = raw.get_blob_client(store.record_name(KEY))
    copy.upload_blob(raw.get_blob_client(store.record_name(other)).download_blob().readall())
    with pytest.raises(CorruptRecord, match=re.escape("belongs to key azure.tests/another key")):
        store.acquire(KEY, AcquireRequest("bob", 60))
    assert [s.key for s in store.list()] == [other]


def test_an_oversized_blob_in_place_of_a_record_is_not_downloaded(
    store: AzureBlobStore, raw: ContainerClient
) -> None:
    raw.create_container()
    raw.get_blob_client(store.record_name(KEY)).upload_blob(b"{" * (2 * 1024 * 1024))
    with pytest.raises(CorruptRecord, match=r"not a dibs record \(it is 2097152 bytes, more than 1048576"):
        store.read(KEY)


def test_a_tampered_payload_fails_its_check_and_is_left_for_inspection(
    store: AzureBlobStore, raw: ContainerClient
) -> None:
    _complete(store, _granted(store.acquire(KEY, AcquireRequest("alice", 60))), b"the real value")
    artifact = store.read(KEY).artifact
    assert artifact is not None
    blob = raw.get_blob_client(store.artifact_name(KEY, artifact))
    assert blob.get_blob_properties().metadata["dibs_checksum"] == checksum(b"the real value")
    blob.upload_blob(b"the fake value", overwrite=True)

    tampered = store.read(KEY).artifact
    assert tampered is not None and tampered.payload == b"the fake value"
    with pytest.raises(ArtifactCorrupted, match="failed its integrity check"):
        tampered.verified_payload(KEY)
    hit = store.acquire(KEY, AcquireRequest("bob", 60))
    assert isinstance(hit, Present)
    with pytest.raises(ArtifactCorrupted):
        hit.artifact.verified_payload(KEY)
    assert blob.download_blob().readall() == b"the fake value"  # still there to inspect

    assert store.forget(KEY) is True  # the documented way out: forget, recompute
    assert not blob.exists()
    _complete(store, _granted(store.acquire(KEY, AcquireRequest("bob", 60))), b"recomputed")
    again = store.read(KEY).artifact
    assert again is not None and again.verified_payload(KEY) == b"recomputed"


def test_a_missing_payload_fails_its_check(
    store: AzureBlobStore, raw: ContainerClient, caplog: pytest.LogCaptureFixture
) -> None:
    _complete(store, _granted(store.acquire(KEY, AcquireRequest("alice", 60))), b"value")
    artifact = store.read(KEY).artifact
    assert artifact is not None
    raw.delete_blob(store.artifact_name(KEY, artifact))
    with caplog.at_level(logging.WARNING, logger="dibs"):
        state = store.read(KEY)
    assert "payload of azure.tests/the key is missing" in caplog.text
    assert state.artifact is not None
    with pytest.raises(ArtifactCorrupted):
        state.artifact.verified_payload(KEY)


def test_a_large_payload_goes_in_parallel_blocks_and_comes_back_whole(
    store: AzureBlobStore, raw: ContainerClient
) -> None:
    payload = bytes(range(256)) * (4096 * 21)  # 21 MiB: above the single-request size
    _complete(store, _granted(store.acquire(KEY, AcquireRequest("alice", 60))), payload)
    artifact = store.read(KEY).artifact
    assert artifact is not None and artifact.verified_payload(KEY) == payload
    blob = raw.get_blob_client(store.artifact_name(KEY, artifact))
    assert len(blob.get_block_list("committed")[0]) > 1  # uploaded as blocks, not one request
    assert blob.get_blob_properties().metadata["dibs_size"] == str(len(payload))


def test_a_fenced_out_holder_leaves_no_payload_behind(
    open_azure: Callable[[], AzureBlobStore], raw: ContainerClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    holder, operator = open_azure(), open_azure()
    lease = _granted(holder.acquire(KEY, AcquireRequest("alice", 60)))
    upload = holder._upload_artifact

    def upload_then_get_fenced_out(*args: Any) -> tuple[str, bool]:
        result = upload(*args)
        assert operator.force_release(KEY)  # between the upload and the record swap
        return result

    monkeypatch.setattr(holder, "_upload_artifact", upload_then_get_fenced_out)
    with pytest.raises(LeaseLost, match="released"):
        _complete(holder, lease, b"too late")
    assert list(raw.list_blobs(name_starts_with=f"{holder.prefix}artifacts/")) == []


class _LoseFirstResponse(RequestsTransport):  # type: ignore[misc]
    """Sends each request, but for the first record write pretends the connection dropped afterwards."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.dropped = 0

    def send(self, request: Any, **kwargs: Any) -> Any:
        response = super().send(request, **kwargs)
        if request.method == "PUT" and "/records/" in request.url and not self.dropped:
            self.dropped += 1
            raise ServiceResponseError("connection reset by peer (simulated)")
        return response


def test_a_write_whose_response_was_lost_still_counts_as_ours(azure_url: str) -> None:
    for action in ("acquire", "complete", "release"):
        transport = _LoseFirstResponse()
        key = Key("azure.lost", action)
        with AzureBlobStore.from_url(azure_url, transport=transport) as store:
            if action != "acquire":
                lease = _granted(store.acquire(key, AcquireRequest("alice", 60)))
                transport.dropped = 0
            if action == "acquire":
                lease = _granted(
                    store.acquire(key, AcquireRequest("alice", 60))
                )  # the SDK retried into a 409
                assert lease.token.fence == 1
            elif action == "complete":
                _complete(store, lease, b"v")  # the SDK retried into a 412: no spurious LeaseLost
                assert store.read(key).status == "done"
            else:
                store.release(key, lease.token, "boom")
                assert store.read(key).status == "failed"
            assert transport.dropped == 1


class _FailFirstRead(RequestsTransport):  # type: ignore[misc]
    """The first read of a record fails before any response, as a reset connection does."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.failed = 0

    def send(self, request: Any, **kwargs: Any) -> Any:
        blob_read = request.method == "GET" and "comp=list" not in request.url
        if blob_read and "/records/" in request.url and not self.failed:
            self.failed += 1
            raise ServiceRequestError("connection reset by peer (simulated)")
        return super().send(request, **kwargs)


def test_a_read_retried_after_a_connection_error_still_knows_the_service_time(azure_url: str) -> None:
    # Regression (seen in the fan-in benchmark): when the SDK retries a request that got no response,
    # it drops the per-call hooks that record the service's Date, and the read failed with "answered a
    # read ... without a usable Date header".
    for operation in ("read", "acquire", "list"):
        transport = _FailFirstRead()
        key = Key("azure.retried", operation)
        with AzureBlobStore.from_url(azure_url, transport=transport) as store:
            if operation == "read":
                assert store.read(key).status == "free"
            elif operation == "acquire":
                assert _granted(store.acquire(key, AcquireRequest("alice", 60))).token.fence == 1
            else:
                store.acquire(key, AcquireRequest("alice", 60))
                transport.failed = 0
                assert key in [state.key for state in store.list(key.namespace)]
            assert transport.failed == 1


def test_the_container_is_created_when_missing_even_mid_use(
    store: AzureBlobStore, raw: ContainerClient
) -> None:
    assert not raw.exists()
    assert store.read(KEY).status == "free"  # reading creates nothing
    assert list(store.list()) == []
    assert not raw.exists()
    first = _granted(store.acquire(KEY, AcquireRequest("alice", 60)))
    assert raw.exists()
    raw.delete_container()
    # Azurite frees a deleted container's name at once (Azure may refuse it for a while: that is a
    # StoreUnavailable there). The fence restarts with the container: the records were deleted.
    again = _granted(store.acquire(KEY, AcquireRequest("alice", 60)))
    assert again.token.fence == first.token.fence


@pytest.mark.parametrize("service_says", ["ContainerBeingDeleted", "nothing, yet the container stays gone"])
def test_a_container_that_cannot_be_created_is_unavailable_not_a_loop(
    store: AzureBlobStore, monkeypatch: pytest.MonkeyPatch, service_says: str
) -> None:
    def create_container(**kwargs: Any) -> None:
        if service_says == "ContainerBeingDeleted":  # Azure, for a while after a delete
            refused = ResourceExistsError("The specified container is being deleted. Try operation later.")
            refused.error_code = "ContainerBeingDeleted"
            raise refused

    monkeypatch.setattr(store._container, "create_container", create_container)
    expected = service_says if service_says == "ContainerBeingDeleted" else "ContainerNotFound"
    with pytest.raises(StoreUnavailable, match=expected):
        store.acquire(KEY, AcquireRequest("alice", 60))


def test_the_async_client_runs_the_same_store(store: AzureBlobStore) -> None:
    async def work() -> str:
        return "async"

    async def scenario() -> None:
        client = Reservations(store, namespace=KEY.namespace, ttl=60).aio()
        assert await client.run(KEY.name, work) == "async"
        hit = await client.wait(KEY.name)
        assert hit is not None and hit.value == "async"

    asyncio.run(scenario())


def test_an_unreachable_service_is_unavailable_without_secrets(caplog: pytest.LogCaptureFixture) -> None:
    endpoint = f"http://127.0.0.1:{azurite.free_port()}/devstoreaccount1"  # nobody listens there
    sas = quote(SECRET_SAS, safe="")
    urls = {
        "sas": f"azure://cache?account_url={endpoint}&sas_token={sas}&retries=0&timeout=5",
        "key": f"azure://cache?account_url={endpoint}&account_key={quote(SECRET_KEY, safe='')}&retries=0",
    }
    for url in urls.values():
        with caplog.at_level(logging.DEBUG, logger="dibs"), AzureBlobStore.from_url(url) as store:
            with pytest.raises(
                StoreUnavailable, match=re.escape("could not read the record of azure.tests/the key")
            ) as caught:
                store.acquire(KEY, AcquireRequest("alice", 60))
            shown = "".join(traceback.format_exception(caught.value)) + repr(caught.value) + caplog.text
            _assert_no_secret(shown, SECRET_KEY, SECRET_SIG)
            assert caught.value.__cause__ is None and caught.value.__suppress_context__
            assert json.dumps(caught.value.fields)  # plain fields: picklable, loggable


@pytest.fixture
def own_azurite(tmp_path: Path) -> Iterator[azurite.Azurite]:
    """An emulator of this test's own, so that stopping it disturbs no other test."""
    try:
        emulator = azurite.Azurite(tmp_path / "azurite")
        emulator.start()
    except azurite.AzuriteUnavailable as exc:
        unavailable(f"no Azurite for the Azure store tests: {exc}")
    yield emulator
    emulator.stop()


def test_an_emulator_restart_is_unavailable_then_recovers_with_the_lease_intact(
    own_azurite: azurite.Azurite,
) -> None:
    url = backend.url_for(
        own_azurite.connection_string, backend.fresh_container(), "p", retries="0", timeout="5"
    )
    with AzureBlobStore.from_url(url) as store:
        lease = _granted(store.acquire(KEY, AcquireRequest("alice", 600)))
        own_azurite.stop()
        with pytest.raises(StoreUnavailable, match="could not read the record of") as caught:
            store.heartbeat(KEY, lease.token, 600)
        _assert_no_secret(str(caught.value), azurite.DEV_KEY)
        own_azurite.start()  # same port, same workspace
        renewed = store.heartbeat(KEY, lease.token, 600)
        assert renewed.token == lease.token and renewed.expires_at >= lease.expires_at
        assert isinstance(store.acquire(KEY, AcquireRequest("bob", 60)), Held)
        _complete(store, renewed, b"after the restart")
        artifact = store.read(KEY).artifact
        assert artifact is not None and artifact.verified_payload(KEY) == b"after the restart"


def test_list_skips_other_namespaces_without_reading_them(store: AzureBlobStore) -> None:
    mine, theirs = Key("azure.list", "a"), Key("azure.other", "b")
    store.acquire(mine, AcquireRequest("alice", 60))
    store.acquire(theirs, AcquireRequest("alice", 60))
    reads: list[str] = []
    original = store._list_entry

    def counting(name: str) -> Any:
        reads.append(name)
        return original(name)

    store._list_entry = counting  # type: ignore[method-assign]
    assert [s.key for s in store.list("azure.list")] == [mine]
    assert reads == [store.record_name(mine)]  # the other namespace was filtered by blob metadata
    assert {s.key for s in store.list()} == {mine, theirs}


def test_a_record_survives_a_round_trip_through_the_codec(
    store: AzureBlobStore, raw: ContainerClient
) -> None:
    lease = _granted(store.acquire(KEY, AcquireRequest("alice", 60, 3600)))
    document = json.loads(raw.get_blob_client(store.record_name(KEY)).download_blob().readall())
    assert document["format"] == "dibs.record/1" and document["lease"]["fence"] == lease.token.fence
    state = store.read(KEY)
    assert state.lease is not None and dataclasses.replace(state.lease, key=KEY) == lease


@pytest.mark.parametrize(
    "url", ["azure://user:s3cr3t-pw-7f3a@account/container", "azure://u:s3cr3t-pw-7f3a@127.0.0.1:1/"]
)
def test_credentials_in_the_container_position_are_refused_without_echoing_them(url: str) -> None:
    # Found by the reliability suite's hostile-input scenario: the container-name error quoted them.
    with pytest.raises(ConfigurationError, match="credentials do not belong") as info:
        open_store(url)
    assert "s3cr3t-pw-7f3a" not in str(info.value)
