"""Derived keys name the code, not where it was loaded from (dibs.identity).

Different code never shares a key (two closures of one factory, two lambdas on one line, an edited
body); the same code shares wherever it runs (a script or a module, two checkout paths with
orchestrator-made module names) and whatever cosmetics change (comments, docstrings, decorators'
arguments, formatting).
"""

from __future__ import annotations

import functools
import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from dibs import InvalidKey
from dibs.keys import derive_key

SOURCE = '''
import functools

def make(n):
    def add(x):
        return x + n
    return add

first, second = lambda x: x + 1, lambda x: x + 2
again = lambda x: x + 1

@functools.lru_cache(maxsize=8)
def features(day, region="eu"):
    """Build the features of one day."""
    return [day, region]  # one row per day
'''


def _load(path: Path, module_name: str, source: str = SOURCE) -> ModuleType:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def dag_file(tmp_path: Path) -> ModuleType:
    """The module as Airflow loads a DAG file: a module name made from a digest of its path."""
    return _load(tmp_path / "checkout-1" / "dags" / "features.py", "unusual_prefix_1f2e3d_features")


def test_a_derived_key_reads_name_version_and_digest(dag_file: ModuleType) -> None:
    key = derive_key(dag_file.features, ("2026-11-25",))
    name, _, digest = key.partition("/")
    assert name == "features" and len(digest) == 16 and int(digest, 16) >= 0
    assert derive_key(dag_file.features, ("2026-11-25",), version="2").startswith("features@2/")
    with pytest.raises(InvalidKey, match="without '/'"):
        derive_key(dag_file.features, ("x",), version="a/b")


def test_two_closures_of_one_factory_never_share(dag_file: ModuleType) -> None:
    one, two = dag_file.make(1), dag_file.make(2)
    assert derive_key(one, (1,)) != derive_key(two, (1,))
    assert derive_key(one, (1,)) == derive_key(dag_file.make(1), (1,))  # same code, same value
    assert derive_key(one, (1,)).startswith("make.add/")


def test_two_lambdas_on_one_line_never_share_and_identical_ones_do(dag_file: ModuleType) -> None:
    assert derive_key(dag_file.first, (1,)) != derive_key(dag_file.second, (1,))
    assert derive_key(dag_file.first, (1,)) == derive_key(dag_file.again, (1,))  # the same code


def test_the_same_code_shares_from_another_path_and_module_name(dag_file: ModuleType, tmp_path: Path) -> None:
    moved = _load(tmp_path / "checkout-2" / "other" / "features.py", "unusual_prefix_9a8b7c_features")
    assert derive_key(moved.features, ("d",)) == derive_key(dag_file.features, ("d",))
    assert derive_key(moved.make(3), (1,)) == derive_key(dag_file.make(3), (1,))


def test_comments_docstrings_decorators_and_layout_do_not_change_the_key(
    dag_file: ModuleType, tmp_path: Path
) -> None:
    cosmetic = SOURCE.replace("# one row per day", "# a new comment").replace(
        '"""Build the features of one day."""', '"""Another docstring."""'
    )
    cosmetic = cosmetic.replace("maxsize=8", "maxsize=128").replace(
        "return [day, region]", "return [day,region]"
    )
    edited = _load(tmp_path / "checkout-3" / "features.py", "unusual_prefix_3_features", "\n\n" + cosmetic)
    assert derive_key(edited.features, ("d",)) == derive_key(dag_file.features, ("d",))
    changed = _load(
        tmp_path / "checkout-4" / "features.py",
        "unusual_prefix_4_features",
        SOURCE.replace("return [day, region]", "return [region, day]"),
    )
    assert derive_key(changed.features, ("d",)) != derive_key(dag_file.features, ("d",))


def test_a_script_and_the_same_module_imported_share(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(
        textwrap.dedent(
            """
            from dibs.keys import derive_key

            def job(day):
                return day.upper()

            if __name__ == "__main__":
                print(derive_key(job, ("mon",)))
            """
        )
    )
    as_script = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True)
    imported = _load(script, "pkg.job", script.read_text())
    assert as_script.stdout.strip() == derive_key(imported.job, ("mon",))


class _Client:
    """Something a closure may hold that has no stable digest."""


def test_what_cannot_be_digested_is_said_with_what_to_do() -> None:
    client = _Client()

    def query(sql: str) -> Any:
        return client, sql

    with pytest.raises(InvalidKey, match=r"closes over 'client'.*key='\.\.\.'.*version='\.\.\.'"):
        derive_key(query, ("select 1",))
    assert derive_key(query, ("select 1",), version="1").startswith("test_what_cannot_be_digested")
    with pytest.raises(InvalidKey, match="builtin_function_or_method has no Python source"):
        derive_key(len, ([1],))
    assert derive_key(len, ([1],), version="1").startswith("len@1/")
    with pytest.raises(InvalidKey, match="exclude="):
        derive_key(lambda c: c, (_Client(),))  # an argument without a digest


def test_partials_and_methods_are_named_by_what_they_wrap(dag_file: ModuleType) -> None:
    one = functools.partial(dag_file.features, region="us")
    two = functools.partial(dag_file.features, region="fr")
    assert derive_key(one, ("d",)).startswith("features/")
    assert derive_key(one, ("d",)) != derive_key(two, ("d",))


def test_a_function_keeps_its_key_while_it_appends_to_what_it_closes_over() -> None:
    calls: list[int] = []

    def counted(x: int) -> int:
        calls.append(x)
        return x

    first = derive_key(counted, (1,))
    counted(1)
    assert derive_key(counted, (1,)) == first  # closure values are taken once per function object


def test_a_version_names_the_code_and_what_it_closes_over(dag_file: ModuleType) -> None:
    assert derive_key(dag_file.make(1), (1,), version="1") == derive_key(dag_file.make(2), (1,), version="1")
