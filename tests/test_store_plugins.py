"""Stores from other packages (``dibs.stores.plugins``): a URL scheme registered by an installed
package's entry points opens its store through every door a user has (the Python API, the CLI, a
client's ``payloads=``), and a broken registration is a clear error.

The package is real as Python sees installed packages: a module and its ``.dist-info`` (METADATA
and entry_points.txt) in a folder on the path of a fresh process, which is where
``importlib.metadata`` finds what pip installs. Each check runs in such a process: entry points are
read once per process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PLUGIN = '''
"""A third-party package's stores: a record store and a payload store, dibs's own under other names."""
from pathlib import Path
from urllib.parse import urlsplit

from dibs.payloads.files import FilePayloadStore
from dibs.stores.memory import MemoryStore


class ExampleStore(MemoryStore):
    @classmethod
    def from_url(cls, url):
        return cls("example:" + url.split("://", 1)[1])


class ExamplePayloads(FilePayloadStore):
    @classmethod
    def from_url(cls, url):
        return cls(Path(urlsplit(url).path))


class NotAStore:
    @classmethod
    def from_url(cls, url):
        return cls()
'''

ENTRY_POINTS = """
[dibs.stores]
example = dibs_example_plugin:ExampleStore
sqlite = dibs_example_plugin:NotAStore
notastore = dibs_example_plugin:NotAStore
broken = dibs_example_plugin_missing:Store

[dibs.payload_stores]
exblobs = dibs_example_plugin:ExamplePayloads
"""


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A folder holding the package as pip would install it."""
    folder = tmp_path / "site"
    folder.mkdir()
    (folder / "dibs_example_plugin.py").write_text(PLUGIN, encoding="utf-8")
    info = folder / "dibs_example_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: dibs-example-plugin\nVersion: 1.0\n", encoding="utf-8"
    )
    (info / "entry_points.txt").write_text(ENTRY_POINTS, encoding="utf-8")
    return folder


def _run(site: Path, code: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(site)!r})\n" + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_registered_scheme_opens_its_store_for_the_api_and_payloads(site: Path, tmp_path: Path) -> None:
    payloads = tmp_path / "blobs"
    found = _run(
        site,
        f"""
        import json
        import dibs
        from dibs.stores import open_store

        store = open_store("example://space")
        with dibs.Reservations("example://space", payloads="exblobs://{payloads}") as client:
            first = client.compute("k", lambda: "x" * 200_000)
            again = client.compute("k", lambda: "y")
        print(json.dumps({{
            "store": type(store).__name__,
            "roles": [first.role, again.role],
            "same": again.value == "x" * 200_000,
            "payload_store": type(client.store.payloads).__name__,
        }}))
        """,
    )
    assert found == {
        "store": "ExampleStore",
        "roles": ["computed", "hit"],
        "same": True,
        "payload_store": "ExamplePayloads",
    }
    assert any(path.is_file() for path in payloads.rglob("*"))  # the large value went to its folder


def test_the_cli_takes_a_registered_scheme(site: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sys; sys.path.insert(0, {str(site)!r}); from dibs.cli import main; sys.exit(main())",
            "--store",
            "example://cli",
            "run",
            "--key",
            "k",
            "--",
            "echo",
            "hi",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (done.returncode, done.stdout) == (0, "hi\n"), done.stderr


def test_dibs_own_schemes_come_first_and_broken_registrations_are_named(site: Path, tmp_path: Path) -> None:
    found = _run(
        site,
        f"""
        import json
        from dibs.errors import ConfigurationError
        from dibs.stores import open_store

        said = {{}}
        said["sqlite"] = type(open_store("sqlite:///{tmp_path / "own.db"}")).__name__
        for scheme in ("notastore", "broken", "nothing"):
            try:
                open_store(scheme + "://x")
            except ConfigurationError as exc:
                said[scheme] = str(exc)
        print(json.dumps(said))
        """,
    )
    assert found["sqlite"] == "SQLStore"  # a package cannot take dibs's own scheme over
    notastore = str(found["notastore"])
    assert "'dibs_example_plugin:NotAStore'" in notastore and "package dibs-example-plugin 1.0" in notastore
    assert "expected a subclass of dibs.stores.base.Store" in notastore
    broken = str(found["broken"])
    assert "could not be loaded: ModuleNotFoundError" in broken and "dibs_example_plugin_missing" in broken
    nothing = str(found["nothing"])
    assert "unknown store scheme 'nothing'" in nothing
    assert "from installed packages: broken, example, notastore" in nothing  # sqlite is dibs's own
