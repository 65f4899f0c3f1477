"""BLAKE3 payloads (a folder store's ``?digest=blake3``): named, stored, read, checked and collected as
SHA-256 ones are, beside them; old SHA-256 references keep reading; a missing extra is said plainly."""

from __future__ import annotations

import hashlib
import io
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import blake3
import pytest

import dibs
from dibs.errors import ConfigurationError
from dibs.payloads import (
    REFERENCE,
    Payload,
    PayloadDamaged,
    PayloadStore,
    ReferencingStore,
    open_payload_store,
)
from dibs.payloads.base import address, is_address, split_address
from dibs.payloads.collect import referenced_digest
from dibs.payloads.files import FilePayloadStore
from dibs.payloads.fsspec import FsspecPayloadStore
from dibs.payloads.references import decode, encode
from dibs.payloads.verify import read_verified, spool_verified
from dibs.testing.payloads import PayloadStoreContract, opened_payload_stores

BIG = 300_000  # above the default 64 KiB inline limit, and several of the hashing thread's chunks


def _b3(data: bytes) -> str:
    return blake3.blake3(data).hexdigest()


def _files(root: Path, digest: str) -> list[Path]:
    return sorted(path for path in (root / digest).rglob("*") if path.is_file())


def _client(records_url: str, payloads_url: str) -> dibs.Reservations:
    return dibs.Reservations(records_url, payloads=payloads_url, serializer="bytes", payload_grace=0.0)


def _record(client: dibs.Reservations, key: str) -> dibs.records.ArtifactRecord:
    assert isinstance(client.store, ReferencingStore)
    artifact = client.store.records.read(client.key(key)).artifact
    assert artifact is not None
    return artifact


@pytest.mark.parametrize("size", [0, 1, 70_000, 5 * 1024 * 1024 + 3])
def test_a_blake3_store_names_payloads_by_blake3_and_reads_them_back_checked(
    tmp_path: Path, size: int
) -> None:
    store = FilePayloadStore.from_url((tmp_path / "p").as_uri() + "?digest=blake3")
    data = os.urandom(size)
    for put in (store.put(data, "json"), store.put_stream(io.BytesIO(data), "json")):
        assert put == Payload(f"blake3:{_b3(data)}", size, "json")
        assert put.digest == "blake3" and put.checksum == f"blake3:{_b3(data)}"
        assert read_verified(store, put, store.uri(put.sha256)) == data
        with spool_verified(store, put, store.uri(put.sha256)) as spooled:
            assert spooled.read() == data
    copies = _files(tmp_path / "p", "blake3")
    assert len(copies) == 2 and all(copy.name.startswith(_b3(data) + ".") for copy in copies)
    assert not (tmp_path / "p" / "sha256").exists()  # the SHA-256 layout is untouched
    assert store.uri(put.sha256).endswith(f"/blake3/{_b3(data)[:2]}/{_b3(data)}")
    assert {found.sha256 for found in store.list()} == {put.sha256}


def test_a_vouched_sha256_keeps_its_name_in_a_blake3_store(tmp_path: Path) -> None:
    """What the lease hashed already (a wrapped store's complete) is stored under that SHA-256, not
    hashed again."""
    store = FilePayloadStore.from_url((tmp_path / "p").as_uri() + "?digest=blake3")
    data = os.urandom(BIG)
    put = store.put(data, sha256=hashlib.sha256(data).hexdigest())
    assert put.sha256 == hashlib.sha256(data).hexdigest() and put.digest == "sha256"
    assert read_verified(store, put, store.uri(put.sha256)) == data
    assert len(_files(tmp_path / "p", "sha256")) == 1


def test_a_hand_off_through_a_blake3_store_records_the_function_in_its_reference(
    records_url: str, tmp_path: Path
) -> None:
    url = (tmp_path / "p").as_uri() + "?digest=blake3"
    value = os.urandom(BIG)
    with _client(records_url, url) as client:
        assert client.run("big", lambda: value) == value
        record = _record(client, "big")
        assert record.serializer == REFERENCE and record.checksum == f"blake3:{_b3(value)}"
        assert b'"blake3":' in record.payload and b'"sha256"' not in record.payload
        with _client(records_url, url) as other:  # another process would be the same
            hit = other.get_or_reserve("big")
            assert isinstance(hit, dibs.Hit) and hit.value == value


def test_old_sha256_payloads_keep_reading_and_collecting_beside_new_blake3_ones(
    records_url: str, tmp_path: Path
) -> None:
    """A store switched to BLAKE3 reads what it wrote under SHA-256, and its collection keeps what is
    referenced of both kinds and removes what is not, of both kinds."""
    folder = tmp_path / "p"
    old, new, gone_old, gone_new = (os.urandom(BIG) for _ in range(4))
    with _client(records_url, folder.as_uri()) as before:
        before.run("old", lambda: old)
        before.run("gone-old", lambda: gone_old)
    with _client(records_url, folder.as_uri() + "?digest=blake3") as after:
        hit = after.get_or_reserve("old")
        assert isinstance(hit, dibs.Hit) and hit.value == old
        after.run("new", lambda: new)
        after.run("gone-new", lambda: gone_new)
        assert _record(after, "old").checksum == f"sha256:{hashlib.sha256(old).hexdigest()}"
        assert _record(after, "new").checksum == f"blake3:{_b3(new)}"
        assert after.forget("gone-old") and after.forget("gone-new")
        assert isinstance(after.store, ReferencingStore)
        after.store.collect()  # every payload: the forgotten keys', and those still referred to
        left = {path.name.partition(".")[0] for path in _files(folder, "sha256") + _files(folder, "blake3")}
        assert left == {hashlib.sha256(old).hexdigest(), _b3(new)}
    with _client(records_url, folder.as_uri()) as sha256_again:  # and back: both still read
        for key, value in (("old", old), ("new", new)):
            hit = sha256_again.get_or_reserve(key)
            assert isinstance(hit, dibs.Hit) and hit.value == value


def test_a_blake3_payload_altered_at_its_size_is_refused_and_computes_again(
    records_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = (tmp_path / "p").as_uri() + "?digest=blake3"
    value = os.urandom(BIG)
    with _client(records_url, url) as client:
        client.run("big", lambda: value)
        (copy,) = _files(tmp_path / "p", "blake3")
        with open(copy, "r+b") as stream:  # one byte flipped in the middle: the same size
            stream.seek(BIG // 2)
            byte = stream.read(1)
            stream.seek(BIG // 2)
            stream.write(bytes([byte[0] ^ 0xFF]))
        store = client.store
        assert isinstance(store, ReferencingStore)
        reference, uri = decode(_record(client, "big").payload, "test")
        with pytest.raises(PayloadDamaged, match=r"does not match its recorded BLAKE3 \([0-9a-f]{64} != "):
            read_verified(store.payloads, reference, uri)
        assert _files(tmp_path / "p", "blake3") == []  # the damaged copy is removed as it is found
        client.run("big", lambda: value)  # written again; a fresh client finds the good one
    with _client(records_url, url) as other:
        hit = other.get_or_reserve("big")
        assert isinstance(hit, dibs.Hit) and hit.value == value


def test_a_waiter_never_gets_an_altered_blake3_payload(records_url: str, tmp_path: Path) -> None:
    url = (tmp_path / "p").as_uri() + "?digest=blake3"
    value = os.urandom(BIG)
    with _client(records_url, url) as client:
        client.run("big", lambda: value)
        (copy,) = _files(tmp_path / "p", "blake3")
        copy.write_bytes(os.urandom(BIG))
    with _client(records_url, url) as other:
        got = other.get_or_reserve("big")
        assert isinstance(got, dibs.Acquired)  # a miss: the key computes again
        got.lease.release()


def test_a_blake3_store_without_the_extra_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "blake3", None)  # what an install without the extra finds
    url = (tmp_path / "p").as_uri() + "?digest=blake3"
    with pytest.raises(ConfigurationError, match=r"pip install 'dibs\[blake3\]'"):
        FilePayloadStore.from_url(url)
    # A store that writes SHA-256 needs nothing more; a BLAKE3 payload it cannot check, it says why.
    store = FilePayloadStore.from_url((tmp_path / "p").as_uri())
    payload = Payload(f"blake3:{'0' * 64}", 3)
    (tmp_path / "p" / "blake3" / "00").mkdir(parents=True)
    (tmp_path / "p" / "blake3" / "00" / ("0" * 64)).write_bytes(b"abc")
    with pytest.raises(ConfigurationError, match=r"pip install 'dibs\[blake3\]'"):
        read_verified(store, payload, store.uri(payload.sha256))


@pytest.mark.parametrize(
    "query, what",
    [("digest=md5", "'md5' is not a digest function"), ("digest=blake3&x=1", "takes one option")],
)
def test_a_folder_store_url_with_a_wrong_option_is_refused(tmp_path: Path, query: str, what: str) -> None:
    with pytest.raises(ConfigurationError, match=what):
        FilePayloadStore.from_url(f"{(tmp_path / 'p').as_uri()}?{query}")


def test_only_the_folder_store_takes_a_digest_option(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"\?digest= is a folder payload store's option"):
        open_payload_store(f"memory://{tmp_path}/p?digest=blake3".replace("memory", "s3"))


def test_a_store_of_sha256_payloads_only_finds_no_blake3_payload(tmp_path: Path) -> None:
    """A BLAKE3 reference read through an fsspec store (the payload store URL changed): missing, a miss."""
    store = FsspecPayloadStore.from_url(f"file://{tmp_path / 'fs'}")
    named = address("blake3", _b3(b"x" * BIG))
    assert store.copies(named) == [] and store.stat(named) is None
    with pytest.raises(dibs.payloads.PayloadUnavailable, match="missing"):
        store.open(named)


def test_references_and_checksums_name_their_digest_function() -> None:
    sha, b3 = hashlib.sha256(b"v").hexdigest(), _b3(b"v")
    old = Payload(sha, 1, "bytes")
    # A SHA-256 reference is the very document dibs always wrote.
    assert encode(old, "u") == b'{"serializer":"bytes","sha256":"%s","size":1,"uri":"u","v":1}' % sha.encode()
    new = Payload(f"blake3:{b3}", 1, "bytes")
    for payload in (old, new):
        assert decode(encode(payload, "u"), "test") == (payload, "u")
    assert referenced_digest(REFERENCE, old.checksum) == sha
    assert referenced_digest(REFERENCE, new.checksum) == f"blake3:{b3}"
    assert referenced_digest(REFERENCE, "md5:" + sha) is None
    assert split_address(new.sha256) == ("blake3", b3) and split_address(sha) == ("sha256", sha)
    assert not is_address(f"sha256:{sha}") and not is_address(f"blake3:{b3.upper()}")
    both = b'{"serializer":"bytes","sha256":"%s","blake3":"%s","size":1,"uri":"u","v":1}' % (
        sha.encode(),
        b3.encode(),
    )
    with pytest.raises(dibs.errors.ArtifactCorrupted, match="cannot be read"):
        decode(both, "test")


def _blake3_copies(store: PayloadStore, named: str) -> list[Path]:
    assert isinstance(store, FilePayloadStore)
    digest, hexdigest = split_address(named)
    return [store.root / digest / hexdigest[:2] / copy.copy for copy in store.copies(named)]


class TestBlake3FolderContract(PayloadStoreContract):
    """The payload store contract (removal's bargain, damage, debris) on a folder told ``?digest=blake3``."""

    @pytest.fixture
    def open_payload_store(self, tmp_path: Path) -> Iterator[Callable[[], PayloadStore]]:
        url = (tmp_path / "payloads").as_uri() + "?digest=blake3"
        with opened_payload_stores(lambda: FilePayloadStore.from_url(url)) as opener:
            yield opener

    @pytest.fixture
    def tamper(self) -> Callable[[PayloadStore, str, bytes], None]:
        def tamper(store: PayloadStore, named: str, data: bytes) -> None:
            for path in _blake3_copies(store, named):
                path.write_bytes(data)

        return tamper

    @pytest.fixture
    def plant(self, tmp_path: Path) -> Callable[[PayloadStore, str, str], None]:
        def plant(store: PayloadStore, named: str, kind: str) -> None:
            for path in _blake3_copies(store, named):
                path.unlink()
                if kind == "fifo":
                    os.mkfifo(path)
                elif kind == "directory":
                    path.mkdir()
                else:
                    target = tmp_path / f"outside-{kind}-{path.name}"
                    os.mkfifo(target)
                    path.symlink_to(target)

        return plant

    def test_a_put_reads_back_whole_by_its_digest(self, payloads: PayloadStore) -> None:
        """The contract's own test expects a SHA-256 name; here the name is the BLAKE3 address."""
        data = os.urandom(70_000)
        put = payloads.put(data, "json")
        assert (put.sha256, put.size, put.serializer) == (f"blake3:{_b3(data)}", len(data), "json")
        assert payloads.put_stream(io.BytesIO(data), "json") == put
        assert read_verified(payloads, put, payloads.uri(put.sha256)) == data
