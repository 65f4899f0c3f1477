from __future__ import annotations

import pickle

import pytest

import dibs
from dibs import errors
from dibs.serializers import BytesSerializer, JSONSerializer, SignedPickleSerializer, resolve_serializer

KEY = b"k" * 32


def test_json_round_trip_and_clear_refusal() -> None:
    s = JSONSerializer()
    assert s.loads(s.dumps({"b": [1, 2.5, None], "a": "é"})) == {"a": "é", "b": [1, 2.5, None]}
    with pytest.raises(dibs.SerializationError, match="cannot store a set as JSON"):
        s.dumps({1, 2})


def test_bytes_serializer_only_takes_bytes() -> None:
    assert BytesSerializer().dumps(bytearray(b"ab")) == b"ab"
    with pytest.raises(dibs.SerializationError, match="got str"):
        BytesSerializer().dumps("text")


def test_signed_pickle_refuses_unsigned_or_tampered_payloads_without_unpickling() -> None:
    signed = SignedPickleSerializer(KEY)
    payload = signed.dumps({"model": [1, 2, 3]})
    assert signed.loads(payload) == {"model": [1, 2, 3]}

    class Boom:
        def __reduce__(self) -> tuple[object, ...]:
            return (pytest.fail, ("unpickled attacker payload",))

    with pytest.raises(dibs.ArtifactCorrupted, match="NOT unpickled"):
        signed.loads(pickle.dumps(Boom()))
    with pytest.raises(dibs.ArtifactCorrupted):
        signed.loads(payload[:-1] + bytes([payload[-1] ^ 1]))
    with pytest.raises(dibs.ArtifactCorrupted):
        SignedPickleSerializer(b"x" * 32).loads(payload)
    assert "***" in repr(signed) and "kkkk" not in repr(signed)


def test_pickle_needs_a_signing_key_and_unknown_names_are_refused() -> None:
    with pytest.raises(dibs.ConfigurationError, match="signing_key"):
        resolve_serializer("pickle")
    with pytest.raises(dibs.ConfigurationError, match="at least 16 bytes"):
        resolve_serializer("pickle", signing_key="short")
    with pytest.raises(dibs.ConfigurationError, match="unknown serializer 'yaml'"):
        resolve_serializer("yaml")


@pytest.mark.parametrize(
    "error",
    [
        errors.LeaseLost("lost default/k", key="default/k", token=3, holder="bob"),
        errors.WaitTimeout("gave up", key="default/k", holder="bob"),
        errors.InvalidKey("bad", name="x"),
        errors.StoreUnavailable("down", store="sqlite:///x"),
        errors.ArtifactCorrupted("bad sum", key="default/k"),
    ],
)
def test_errors_pickle_with_their_fields(error: errors.ReservationError) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error) and copy.fields == error.fields
    assert isinstance(copy, dibs.ReservationError)


def test_error_tree() -> None:
    assert issubclass(dibs.InvalidKey, dibs.ConfigurationError)
    assert issubclass(dibs.ConfigurationError, ValueError)
    assert issubclass(dibs.WaitTimeout, TimeoutError)
