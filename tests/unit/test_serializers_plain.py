"""A large JSON document that is one plain string is read from its bytes, as json.loads reads it."""

from __future__ import annotations

import json

import pytest

from dibs.errors import SerializationError
from dibs.serializers import JSONSerializer

JSON = JSONSerializer()


@pytest.mark.parametrize(
    "value",
    [
        "a" * 100_000,
        "é" * 70_000,
        'q"uote' * 20_000,
        "line\nbreak" * 10_000,
        "\x7f" * 70_000,
        ["a" * 100_000],
        "short",
    ],
)
def test_the_value_is_json_loads_value(value: object) -> None:
    payload = JSON.dumps(value)
    assert JSON.loads(payload) == json.loads(payload) == value


@pytest.mark.parametrize(
    "payload", [b'"' + b"a" * 100_000 + b'" "', b'"' + b"\xff" * 100_000 + b'"', b'"' + b"a" * 100_000]
)
def test_what_json_refuses_is_refused(payload: bytes) -> None:
    with pytest.raises(SerializationError):
        JSON.loads(payload)
