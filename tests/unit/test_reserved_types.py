"""``prefect_dibs.reserved`` takes its options as one ``TypedDict`` (``**options``), yet type checkers
and Python still see each one: ``@reserved`` and ``@reserved(...)`` keep the decorated function's
type, a wrong option's type is an error, and a misspelt option is refused by mypy and at run time.

The typing is checked by running mypy (strict, as the project) on a small user module; nothing of it
is run. No Prefect API is needed: ``reserved`` refuses an option before it looks at any.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from mypy import api

from prefect_dibs import reserved
from prefect_dibs.tasks import RESERVED_DEFAULTS

ROOT = Path(__file__).resolve().parents[2]

USER_MODULE = """\
from prefect import task
from prefect_dibs import reserved

@reserved
def bare(day: str) -> int:
    return len(day)

@reserved("sqlite:///x.db", key="k-{day}", ttl=30, progress_interval=5.0, exclude=["x"], artifact=False)
def configured(day: str) -> int:
    return len(day)

@reserved(version="2")
@task
def on_task(day: str) -> int:
    return len(day)

reveal_type(bare("x"))  # line 17
reveal_type(configured("x"))
reveal_type(on_task)
configured(1)  # line 20: not a str
reserved(ttl="30")  # line 21: not a number
reserved(tll=30)  # line 22: misspelt
"""


@pytest.fixture(scope="module")
def mypy_says(tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    folder = tmp_path_factory.mktemp("typed")
    (folder / "user.py").write_text(USER_MODULE)
    (folder / "mypy.ini").write_text(
        f"[mypy]\nstrict = True\npython_version = 3.11\n"
        f"mypy_path = {ROOT / 'src'}:{ROOT / 'prefect_integration'}\n"
    )
    out, err, _ = api.run(
        [
            "--config-file",
            str(folder / "mypy.ini"),
            "--cache-dir",
            str(folder / "cache"),
            str(folder / "user.py"),
        ]
    )
    assert not err, err
    said: dict[int, str] = {}
    for line in out.splitlines():
        if found := re.match(r".*user\.py:(\d+): (.*)", line):
            said[int(found[1])] = said.get(int(found[1]), "") + found[2] + "\n"
    return said


def test_bare_and_configured_keep_the_function_type(mypy_says: dict[int, str]) -> None:
    assert mypy_says[17] == 'note: Revealed type is "int"\n'
    assert mypy_says[18] == 'note: Revealed type is "int"\n'
    assert mypy_says[19] == 'note: Revealed type is "prefect.tasks.Task[[day: str], int]"\n'
    assert 'expected "str"' in mypy_says[20]


def test_each_option_is_typed_and_a_misspelt_one_is_an_error(mypy_says: dict[int, str]) -> None:
    assert "call-overload" in mypy_says[21]
    assert 'Unexpected keyword argument "tll"' in mypy_says[22]
    assert set(mypy_says) == {17, 18, 19, 20, 21, 22}, mypy_says  # nothing else: the good uses type-check


def test_a_misspelt_option_is_refused_at_run_time() -> None:
    with pytest.raises(TypeError, match="reserved\\(\\) got an unexpected keyword argument 'tll'"):
        reserved(tll=30)  # type: ignore[call-overload]


def test_a_misspelt_option_is_refused_for_a_bare_use_too() -> None:
    def work() -> int:
        return 1

    with pytest.raises(TypeError, match="'tll'"):
        reserved(work, tll=30)  # type: ignore[call-overload]


def test_the_defaults_cannot_be_changed_for_every_later_call() -> None:
    # Every ``@reserved`` starts from RESERVED_DEFAULTS: a caller writing into it would change the
    # defaults of all the others, so it refuses the write.
    with pytest.raises(TypeError):
        RESERVED_DEFAULTS["ttl"] = 1  # type: ignore[index]
    with pytest.raises(TypeError):
        del RESERVED_DEFAULTS["ttl"]  # type: ignore[attr-defined]
    assert RESERVED_DEFAULTS["ttl"] is None
