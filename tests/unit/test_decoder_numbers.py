"""The decoder reads the usual numbers without its regexes (a read decodes about fifteen): each such
shortcut must answer exactly what the full checks answer, value or refusal, for every form."""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest

from dibs.stores.decoder import _Damage, _Reader

TEXTS = [
    "0", "7", "10", "01", "00", "-1", "+1", "1_000", " 1", "1 ", "", "²", "١٢", "1.5", "5.", ".5", "1.2.3",
    "1e5", "1E-3", "-0.5", "nan", "inf", "1" * 400, "2147483647", "2147483648", "9223372036854775807",
    "253402300799", "253402300799.5", "1764236820.123456",
]  # fmt: skip
NATIVE = [0, 7, -1, 2**31, 2**63, 1.5, -0.5, float("nan"), float("inf"), 253402300800.0, True, False, None]


def answer(read: Callable[[], object]) -> object:
    try:
        return ("value", read())
    except _Damage as exc:
        return ("refused", str(exc))


@pytest.mark.parametrize("textual", [True, False])
@pytest.mark.parametrize("value", [*TEXTS, *(text.encode() for text in TEXTS), *NATIVE], ids=repr)
def test_the_shortcut_answers_what_the_full_checks_answer(value: object, textual: bool) -> None:
    reader = _Reader({"n": value}, textual)
    for low, high in [(0, 2**31 - 1), (1, 2**63 - 1)]:
        fast = answer(functools.partial(reader.integer, "n", low=low, high=high))
        assert fast == answer(functools.partial(reader._integer, "n", low, high))
    fast = answer(functools.partial(reader.seconds, "n"))
    full = answer(functools.partial(reader._seconds, "n"))
    assert fast == full and type(fast[1]) is type(full[1])
