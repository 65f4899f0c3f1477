"""The command's words and tables (:mod:`dibs._cli.text`) and its console (:mod:`dibs._cli.console`),
without a subprocess."""

from __future__ import annotations

import base64
import io
import json

import pytest

from dibs._cli.console import Console
from dibs._cli.names import matches
from dibs._cli.text import artifact_text, parse_duration, print_table, size
from dibs.display import duration


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (-1, "0.0s"),
        (0.44, "0.4s"),
        (9.94, "9.9s"),
        (12.4, "12s"),
        (185, "3m 05s"),
        (2 * 3600 + 10 * 60 + 5, "2h 10m"),
        (3 * 86400 + 4 * 3600, "3d 4h"),
    ],
)
def test_durations_are_spelled_out(seconds: float, text: str) -> None:
    assert duration(seconds) == text


@pytest.mark.parametrize(
    ("nbytes", "text"), [(0, "0 B"), (999, "999 B"), (1234, "1.2 kB"), (3_400_000, "3.4 MB")]
)
def test_sizes_use_decimal_units(nbytes: int, text: str) -> None:
    assert size(nbytes) == text


def test_artifacts_are_text_when_utf8_else_base64_and_other_values_stay_json() -> None:
    assert artifact_text("été\n".encode()) == ("été\n", "utf-8")
    assert artifact_text(b"\xff\x00") == (base64.b64encode(b"\xff\x00").decode(), "base64")
    assert artifact_text({"rows": 3}) == ({"rows": 3}, "json")


def test_a_table_wraps_its_last_column_at_word_boundaries_and_never_cuts_a_word() -> None:
    detail = "ValueError: the upstream extract had 1234 rows where 5000 were expected; rerun it afterwards"
    rows = [
        {"key": "features", "status": "failed", "detail": detail},
        {"key": "k", "status": "done", "detail": ""},
    ]
    out = io.StringIO()
    print_table(rows, ["key", "status", "detail"], out, width=50)
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["KEY", "STATUS", "DETAIL"]
    assert all(len(line) <= 50 for line in lines), lines
    indent = lines[0].index("DETAIL")
    continued = [line for line in lines[2:] if not line.startswith("k ")]
    assert continued and all(line[:indent].strip() == "" for line in continued)  # aligned under DETAIL
    assert " ".join(" ".join(lines).split()).count(detail) == 1  # every word whole, in order

    unbounded = io.StringIO()
    print_table(rows, ["key", "status", "detail"], unbounded)
    assert len(unbounded.getvalue().splitlines()) == 3  # no width (not a terminal): one line per row


def test_a_word_longer_than_the_room_left_stays_whole() -> None:
    out = io.StringIO()
    word = "x" * 60
    print_table([{"a": "k", "b": f"short {word} end"}], ["a", "b"], out, width=40)
    assert word in out.getvalue()


def test_warnings_and_errors_are_said_once_even_inside_a_longer_message() -> None:
    stream = io.StringIO()
    console = Console(stream)
    store_down = "could not complete default/k: Redis at redis://127.0.0.1:6379/0 did not answer"
    console.problem("warning", f"heartbeat failed, retrying: {store_down}")
    console.problem("warning", f"heartbeat failed, retrying: {store_down}")
    console.problem("error", f"default/k: computed, but the store failed while storing it: {store_down}")
    console.problem("error", store_down)  # the command's own last word: already said
    console.problem("error", "short")
    console.problem("error", "short")
    assert stream.getvalue().splitlines() == [
        f"dibs: warning: heartbeat failed, retrying: {store_down}",
        f"dibs: error: default/k: computed, but the store failed while storing it: {store_down}",
        "dibs: error: short",
    ]


def test_events_off_a_terminal_are_silent_unless_verbose_and_json_lines_with_json() -> None:
    quiet, verbose, structured = io.StringIO(), io.StringIO(), io.StringIO()
    for console in (
        Console(quiet),
        Console(verbose, verbose=1),
        Console(structured, verbose=1, json_lines=True),
    ):
        assert not console.live
        console.status("dibs: waiting for default/k", "held by w")  # a live line: terminals only
        console.event("takeover", "default/k: took over from 'w'", notable=True, key="default/k")
        console.clear_status()
    assert quiet.getvalue() == ""
    assert verbose.getvalue() == "dibs: default/k: took over from 'w'\n"
    assert json.loads(structured.getvalue()) == {
        "event": "takeover",
        "message": "default/k: took over from 'w'",
        "key": "default/k",
    }


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90.0), ("0", 0.0), ("1.5", 1.5), ("90s", 90.0), ("15m", 900.0), ("12h", 43200.0),
     ("7d", 604800.0), ("2w", 1209600.0), ("1h30m", 5400.0), ("1h 30m", 5400.0), ("3m 05s", 185.0)],
)  # fmt: skip
def test_durations_are_read_as_people_type_them_and_as_the_command_writes_them(
    text: str, seconds: float
) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "3x", "h", "1h30", "-5", "inf", "nan", "5 fortnights", "1e400"])
def test_a_bad_duration_names_the_text_and_the_accepted_forms(text: str) -> None:
    with pytest.raises(ValueError, match="expected a duration") as error:
        parse_duration(text)
    assert repr(text) in str(error.value)


@pytest.mark.parametrize(
    ("name", "pattern", "named"),
    [
        ("load@2/bbbb3333", "load", True),
        ("load/bbbb3333", "load", True),
        ("loader/cccc", "load", False),
        ("load@2/bbbb3333", "load@2", True),
        ("load@20/bbbb3333", "load@2", False),
        ("load@2/bbbb3333", "load@2/bbbb", True),
        ("load@2/bbbb3333", "load@2/cccc", False),
        ("features-2026-11-25", "features-2026-11-25", True),
        ("features-2026-11-25", "features", False),
        ("features-2026-11-25", "features-*", True),
        ("features-2026-11-25", "feat?res-2026-11-2[0-9]", True),
        ("other", "features-*", False),
    ],
)
def test_a_readable_name_names_every_key_of_a_function_a_version_or_a_digest_prefix(
    name: str, pattern: str, named: bool
) -> None:
    assert matches(name, pattern) is named
