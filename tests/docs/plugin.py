"""The pytest plugin that turns the docs' code blocks into tests (loaded by the root ``conftest.py``).

``DOCUMENTS`` lists the Markdown files and what their blocks need; ``testpaths`` in pyproject.toml
points pytest at them, so ``scripts/test`` (pytest with no arguments) collects them.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest
from sybil import Sybil
from sybil.parsers.markdown import CodeBlockParser, SkipParser

from tests.docs import airflow_db
from tests.docs.context import ROOT, DocContext
from tests.docs.evaluators import PythonSnippet, ShellSnippet

AIRFLOW = "airflow"  # Airflow installed; a migrated metadata database for the document's commands
PREFECT = "prefect"  # Prefect installed; the session's Prefect test server (tests/prefect/harness.py)

# Relative path (or pattern) -> what its blocks need. docs/*.md is for pages added later.
DOCUMENTS: dict[str, frozenset[str]] = {
    "README.md": frozenset(),
    "docs/airflow.md": frozenset({AIRFLOW}),
    "docs/prefect.md": frozenset({PREFECT}),
    "prefect_integration/README.md": frozenset({PREFECT}),
    "docs/*.md": frozenset(),
}


def needs(path: Path) -> frozenset[str] | None:
    """What the document's blocks need, or ``None`` for a file that is not one of the docs."""
    try:
        relative = path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return None
    for pattern, needed in DOCUMENTS.items():
        if fnmatch(relative, pattern):
            return needed
    return None


class _Docs(Sybil):
    def should_parse(self, path: Path) -> bool:
        return needs(path) is not None


def _setup(namespace: dict[str, Any]) -> None:
    # Functions defined by a block get this as their __module__ (Airflow and Prefect read it).
    namespace["__name__"] = "snippets"


pytest_collect_file = _Docs(
    parsers=[
        SkipParser(),
        CodeBlockParser(language="python", evaluator=PythonSnippet()),
        CodeBlockParser(language="bash", evaluator=ShellSnippet()),
    ],
    path=str(ROOT),
    setup=_setup,
    fixtures=["docs"],
).pytest()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Pages that need Airflow are to run: migrate its metadata database meanwhile (airflow_db.py).

    Not in a pytest-xdist worker: every worker collects every test but runs only its share, so the
    one that runs such a page migrates when the page first needs the database (``copy_to``), and the
    others do not spend a core on a migration nobody uses."""
    if (
        not session.config.option.collectonly
        and not hasattr(session.config, "workerinput")
        and any(AIRFLOW in (needs(item.path) or ()) for item in session.items)
    ):
        airflow_db.MIGRATED.start()


@pytest.fixture(scope="module")
def docs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DocContext]:
    """The context of one document's blocks: see :class:`~tests.docs.context.DocContext`."""
    document = Path(request.path)
    needed = needs(document) or frozenset()
    for module in sorted(needed):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{document.name} needs {module}: pip install 'dibs[{module}]'")
    workdir = tmp_path_factory.mktemp(document.stem.lower())
    prefect_api = request.getfixturevalue("prefect_api") if PREFECT in needed else None
    context = DocContext(document, workdir, prefect_api=prefect_api, airflow=AIRFLOW in needed)
    with pytest.MonkeyPatch.context() as patch:
        for name in [n for n in os.environ if n.startswith("AIRFLOW_CONN_")]:
            patch.delenv(name)
        patch.setenv("DIBS_STORE_URL", context.store_url)
        patch.setenv("DIBS_HOME", str(workdir / "dibs-home"))
        if AIRFLOW in needed and "airflow" not in sys.modules:
            # Airflow reads its configuration when first imported: a throw-away home, no examples.
            patch.setenv("AIRFLOW_HOME", str(workdir / "airflow-in-process"))
            patch.setenv("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
        try:
            if prefect_api is None:
                yield context
            else:
                from prefect.settings import PREFECT_LOCAL_STORAGE_PATH, temporary_settings

                with temporary_settings({PREFECT_LOCAL_STORAGE_PATH: workdir / "prefect-results"}):
                    yield context
        finally:
            context.close()
