from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

import pytest

import dibs
from dibs import InvalidKey, Key
from dibs.keys import MAX_NAME_LENGTH, canonical_json, derive_key, digest, format_key
from dibs.records import Granted
from dibs.stores import AcquireRequest
from dibs.stores.memory import MemoryStore


@pytest.mark.parametrize("namespace", ["default", "team.features", "a-b_c.d9", "X"])
def test_valid_namespaces(namespace: str) -> None:
    assert Key(namespace, "k").namespace == namespace


@pytest.mark.parametrize(
    "namespace", ["", ".", "a..b", "a.", ".a", "a/b", "../etc", "has space", "é", "x" * 201, "-lead"]
)
def test_invalid_namespaces_name_the_value_and_the_rule(namespace: str) -> None:
    with pytest.raises(InvalidKey, match="namespace") as info:
        Key(namespace, "k")
    assert repr(namespace)[:20] in str(info.value) or len(namespace) > 60


@pytest.mark.parametrize("name", ["", "\x00", "line\nbreak", "tab\there", "x" * (MAX_NAME_LENGTH + 1)])
def test_invalid_names(name: str) -> None:
    with pytest.raises(InvalidKey):
        Key("default", name)


def test_non_string_parts_are_refused_clearly() -> None:
    with pytest.raises(InvalidKey, match="must be a string, got int"):
        Key("default", 42)  # type: ignore[arg-type]


def test_digest_addresses_differ_for_namespace_and_name_boundaries() -> None:
    assert Key("a.b", "c").digest != Key("a", "b.c").digest
    assert len(Key("a", "b").digest) == 64


def test_canonical_digest_ignores_order_and_representation() -> None:
    assert digest({"b": 1, "a": [1, 2]}) == digest({"a": [1, 2], "b": 1})
    assert digest({1, 2, 3}) == digest({3, 2, 1})
    assert digest((1, 2)) == digest([1, 2])
    assert digest({"a": 1}) != digest({"a": 2})
    assert digest(dt.date(2026, 11, 25)) != digest("2026-11-25")
    assert canonical_json(float("nan")) == canonical_json(float("nan"))


def test_digest_of_dataclasses_and_unsupported_types() -> None:
    @dataclasses.dataclass
    class Window:
        start: str
        days: int

    assert digest(Window("2026-11-01", 7)) == digest(Window("2026-11-01", 7))
    assert digest(Window("2026-11-01", 7)) != digest(Window("2026-11-01", 8))
    with pytest.raises(TypeError, match="give the key explicitly"):
        digest(object())


def build(day: str, region: str = "eu", *, verbose: bool = False) -> str:
    return f"{day}-{region}"


def test_derived_keys_bind_arguments_to_the_signature() -> None:
    a = derive_key(build, ("2026-11-25",), {})
    b = derive_key(build, (), {"day": "2026-11-25", "region": "eu"})
    assert a == b
    assert a.startswith("build/")
    assert derive_key(build, ("2026-11-26",), {}) != a
    assert derive_key(build, ("2026-11-25",), {}, version="2") != a
    assert derive_key(build, ("2026-11-25",), {}, version="2").startswith("build@2/")
    quiet = derive_key(build, ("d",), {}, exclude=("verbose",))
    assert derive_key(build, ("d",), {"verbose": True}, exclude=("verbose",)) == quiet
    assert derive_key(build, ("d",), {"verbose": True}) != derive_key(build, ("d",), {})


def test_key_templates_are_filled_from_the_call() -> None:
    assert format_key("features-{day}-{region}", build, ("2026-11-25",), {}) == "features-2026-11-25-eu"
    with pytest.raises(InvalidKey, match="must name parameters: day, region, verbose"):
        format_key("features-{missing}", build, ("x",), {})


@pytest.mark.parametrize(
    ("url", "secret"),
    [
        ("redis://u:p@ss@h:6379/0", "p@ss"),
        ("postgresql+psycopg://dibs:a/b:c@host/db", "a/b:c"),
        ("azure://c/p?account_url=https://a&account_key=XYZ==&x=1", "XYZ=="),
        ("azure://c/p?connection_string=AccountKey%3Dabc", "AccountKey"),
        ("redis://:hunter2@h", "hunter2"),
        ("redis://h/0?password=pw2", "pw2"),
    ],
)
def test_redact_url_hides_passwords_and_secret_parameters(url: str, secret: str) -> None:
    from dibs.stores import redact_url

    redacted = redact_url(url)
    assert secret not in redacted and "***" in redacted
    assert redacted.partition("://")[0] == url.partition("://")[0]


def test_names_that_differ_only_by_unicode_normalization_are_one_key() -> None:
    # "café" with a combining accent (NFD, as macOS file names give it) and with "é" were two keys.
    nfc, nfd = "caf\u00e9", "cafe\u0301"
    assert Key("ns", nfd) == Key("ns", nfc) and Key("ns", nfd).name == nfc
    assert Key("ns", nfd).digest == Key("ns", nfc).digest
    client = dibs.Reservations(MemoryStore(), ttl=60)
    assert isinstance(client.get_or_reserve(nfd, owner="alice"), dibs.Acquired)
    busy = client.get_or_reserve(nfc, owner="bob")
    assert isinstance(busy, dibs.Busy) and busy.holder == "alice"


def test_a_record_written_under_a_non_nfc_name_before_normalization_still_lists(tmp_path: Path) -> None:
    from dibs.stores import open_store

    store = open_store(f"sqlite:///{tmp_path / 'old.db'}")
    old = Key("ns", "x")
    object.__setattr__(old, "name", "cafe\u0301")  # as a dibs before NFC keys wrote it
    assert isinstance(store.acquire(old, AcquireRequest("alice", 60)), Granted)
    listed = list(store.list("ns"))
    assert [state.key.name for state in listed] == ["caf\u00e9"] and listed[0].lease is not None
    store.close()


def test_a_keys_digest_is_computed_once_and_stays_out_of_its_fields() -> None:
    """The digest is cached on the key object (issue 20); equality, repr and replace ignore it."""
    import pickle

    from dibs.keys import address

    key = Key("team.a", "part-0")
    assert key.digest == address("team.a", "part-0") and key.digest is key.digest
    assert key == Key("team.a", "part-0") and "digest" not in repr(key)
    other = dataclasses.replace(key, name="part-1")
    assert other.digest == address("team.a", "part-1")
    assert pickle.loads(pickle.dumps(key)).digest == key.digest
