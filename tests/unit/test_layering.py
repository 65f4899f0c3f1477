"""The integrations stand on the public API only (issue 17, "Layering").

``dibs_provider`` and ``prefect_dibs`` may import from the public modules below, and only the names
each lists in its ``__all__``; whatever else an orchestrator integration needs comes through the one
module written for it, :mod:`dibs.integration`. Anything else is private to the core, and may change
without notice, so an integration that reached it would break on a core refactoring nobody warned it
about. Every module of both integrations is parsed (imports inside functions and under
``TYPE_CHECKING`` count too); nothing of them is imported.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest

import dibs
import dibs.integration

ROOT = Path(__file__).resolve().parents[2]
INTEGRATIONS = [ROOT / "airflow_provider" / "dibs_provider", ROOT / "prefect_integration" / "prefect_dibs"]

#: The core modules whose ``__all__`` is public API: the package itself, and what an integration, a
#: serializer, a third-party store or payload store and an observer are written against. Kept in step
#: with "What integrations may use" in docs/architecture.md.
PUBLIC = (
    "dibs",
    "dibs.errors",
    "dibs.events",
    "dibs.keys",
    "dibs.serializers",
    "dibs.display",
    "dibs.records",
    "dibs.stores",
    "dibs.payloads",
    "dibs.payloads.files",
    "dibs.payloads.fsspec",
    "dibs.observers",
    "dibs.observers.otel",
    "dibs.integration",
)


def _modules() -> Iterator[Path]:
    for package in INTEGRATIONS:
        yield from sorted(package.rglob("*.py"))


def _core_uses(path: Path) -> Iterator[tuple[int, str, str | None]]:
    """Every ``(line, module, name)`` the file takes from ``dibs``; ``name`` is None for ``import dibs.x``."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "dibs" or node.module.startswith("dibs."):
                for alias in node.names:
                    yield node.lineno, node.module, alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "dibs" or alias.name.startswith("dibs."):
                    yield node.lineno, alias.name, None


def _exported(module: str, name: str) -> bool:
    """``name`` is public in ``module``: listed in its ``__all__``, or a public module itself
    (``from dibs import errors``)."""
    return name in importlib.import_module(module).__all__ or f"{module}.{name}" in PUBLIC


def _breaches(path: Path, root: Path = ROOT) -> list[str]:
    found = []
    for line, module, name in _core_uses(path):
        where = f"{path.relative_to(root)}:{line}"
        if module not in PUBLIC:
            found.append(f"{where}: {module} is not a public module ({name or 'import'})")
        elif name is not None and not _exported(module, name):
            found.append(f"{where}: {module}.{name} is not in {module}.__all__")
    return found


def test_the_integrations_import_only_public_names_of_the_core() -> None:
    breaches = [breach for path in _modules() for breach in _breaches(path)]
    assert not breaches, "an integration reaches below the public API:\n" + "\n".join(breaches)


def test_the_check_sees_both_integrations_and_their_core_imports() -> None:
    """Guards the test above against passing on nothing (a moved folder, a parser that finds none)."""
    modules = list(_modules())
    assert {path.parent.name for path in modules} >= {"dibs_provider", "prefect_dibs", "operators"}
    assert sum(1 for path in modules for _ in _core_uses(path)) > 50


def test_the_check_refuses_a_private_module_and_a_private_name(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from dibs import Reservations\n"
        "from dibs.flow import Steps\n"
        "import dibs.runtime\n"
        "def later():\n"
        "    from dibs.keys import _private\n"
    )
    breaches = _breaches(sample, root=tmp_path)
    assert [breach.split(": ", 1)[0] for breach in breaches] == ["sample.py:2", "sample.py:3", "sample.py:5"]


@pytest.mark.parametrize("module", PUBLIC)
def test_every_public_module_lists_what_it_exports(module: str) -> None:
    loaded = importlib.import_module(module)
    exported = loaded.__all__
    assert exported, f"{module} has an empty __all__"
    missing = [name for name in exported if not hasattr(loaded, name)]
    assert not missing, f"{module}.__all__ names what it does not define: {missing}"


def test_the_integration_module_adds_nothing_the_package_already_exports() -> None:
    """One public name, one public place: ``dibs.integration`` holds what ``dibs`` itself does not."""
    assert not set(dibs.integration.__all__) & set(dibs.__all__)


def test_the_integration_module_holds_only_what_an_integration_uses() -> None:
    """``dibs.integration`` is no second ``__all__`` for whatever might be handy: every name in it is
    used by one of the integrations (a name they stop using leaves it, or is argued for here)."""
    used = {
        name for path in _modules() for _, module, name in _core_uses(path) if module == "dibs.integration"
    }
    assert used == set(dibs.integration.__all__)


#: What the flow may import: the decisions' vocabulary, never what does I/O or drives it (issue 32).
_FLOW_FORBIDDEN = (
    "dibs.client",
    "dibs.aio",
    "dibs.seam",
    "dibs.runtime",
    "dibs.hub",
    "dibs.integration",
    "dibs.stores.sql",
    "dibs.stores.redis",
    "dibs.stores.azure",
)


@pytest.mark.parametrize("module", ["flow", "steps"])
def test_the_flow_decides_without_importing_what_drives_it(module: str) -> None:
    """The flow is the only decider and does no I/O: it never imports the client it is a path of, the
    seam that drives it, the runtime, its hub or a store (under ``TYPE_CHECKING`` and in functions too)."""
    path = ROOT / "src" / "dibs" / f"{module}.py"
    imported = {name for _, name, _ in _core_uses(path)}
    assert imported, f"no import of dibs found in {path}: the check sees nothing"
    reached = sorted(
        name for name in imported if any(name == bad or name.startswith(bad + ".") for bad in _FLOW_FORBIDDEN)
    )
    assert not reached, f"dibs.{module} imports {reached}"


def test_the_flow_check_refuses_an_import_of_the_client(tmp_path: Path) -> None:
    sample = tmp_path / "flow.py"
    sample.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from dibs.client import Reservations\n"
    )
    assert {name for _, name, _ in _core_uses(sample)} == {"dibs.client"}
