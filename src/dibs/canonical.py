"""Canonical JSON: equal values give equal text, whatever their order (the input of key digests).

A leaf module: :mod:`dibs.keys` digests arguments with it, and :mod:`dibs.identity` checks closure
and ``functools.partial`` values with it, without either importing the other's half.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import hashlib
import json
import math
import pathlib
import uuid
from collections.abc import Mapping
from typing import Any

from dibs.errors import InvalidKey

__all__ = ["canonical_json"]


def _canonical(value: Any) -> Any:
    """Map a value onto JSON-able data such that equal inputs give equal output, whatever their order."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return {"__float__": repr(value)}
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return {"__bytes__": hashlib.sha256(bytes(value)).hexdigest()}
    if isinstance(value, enum.Enum):
        return {"__enum__": f"{type(value).__qualname__}.{value.name}"}
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return {"__datetime__": value.isoformat()}
    if isinstance(value, dt.timedelta):
        return {"__timedelta__": value.total_seconds()}
    if isinstance(value, decimal.Decimal | uuid.UUID | pathlib.PurePath):
        return {f"__{type(value).__name__.lower()}__": str(value)}
    if isinstance(value, Mapping):
        items = [(_canonical(k), _canonical(v)) for k, v in value.items()]
        return {"__map__": sorted(items, key=lambda item: json.dumps(item[0], sort_keys=True))}
    if isinstance(value, list | tuple):
        return [_canonical(item) for item in value]
    if isinstance(value, set | frozenset):
        members = [_canonical(item) for item in value]
        return {"__set__": sorted(members, key=lambda item: json.dumps(item, sort_keys=True))}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return {"__dataclass__": type(value).__qualname__, "fields": _canonical(fields)}
    model_dump = getattr(value, "model_dump", None)  # pydantic models, without importing pydantic
    if callable(model_dump):
        return {"__model__": type(value).__qualname__, "fields": _canonical(model_dump(mode="json"))}
    raise TypeError(
        f"cannot derive a stable key from a {type(value).__module__}.{type(value).__qualname__} argument; "
        "pass JSON-like data (str, numbers, lists, dicts, dates, dataclasses) or give the key explicitly"
    )


def canonical_json(value: Any) -> str:
    """The canonical JSON text of ``value``: the input to :func:`digest`."""
    try:
        return json.dumps(_canonical(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except RecursionError:
        raise InvalidKey(
            f"cannot derive a stable key from a {type(value).__name__} nested deeper than Python's recursion "
            "limit; give the key explicitly (key=...)",
            name=type(value).__name__,
        ) from None
