"""The DibsStore block: secrets stay secret, the URL carries none, and the CLI registers it."""

from __future__ import annotations

import pickle
import subprocess
import uuid
from pathlib import Path

import pytest

pytest.importorskip("prefect")

from pydantic import SecretStr, ValidationError

from prefect_dibs import DibsStore
from tests.prefect.support import PYTHON, ROOT, in_forked_child


def test_password_is_secret_and_inserted_into_the_url() -> None:
    block = DibsStore(url="postgresql+psycopg://dibs@db.internal:5432/dibs", password=SecretStr("p@ss/word"))
    assert "p@ss" not in repr(block) and "p@ss" not in str(block.model_dump())
    assert block.store_url() == "postgresql+psycopg://dibs:p%40ss%2Fword@db.internal:5432/dibs"
    assert (
        DibsStore(url="redis://cache:6379/0", password=SecretStr("pw")).store_url()
        == "redis://:pw@cache:6379/0"
    )
    assert DibsStore(url="sqlite:////tmp/x.db").store_url() == "sqlite:////tmp/x.db"
    assert DibsStore().store_url() is None


def test_secret_fields_are_declared_to_prefect() -> None:
    schema = DibsStore.model_json_schema()
    assert set(schema["secret_fields"]) == {"password", "signing_key"}
    assert schema["block_type_slug"] == "dibs-store"


def test_a_url_with_a_secret_is_refused_without_echoing_it() -> None:
    with pytest.raises(ValidationError, match="password") as caught:
        DibsStore(url="postgresql://dibs:hunter2@db/dibs")
    assert "hunter2" not in str(caught.value)
    with pytest.raises(ValidationError, match="not a store URL"):
        DibsStore(url="just-a-name")


def test_pickle_needs_a_signing_key(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="signing_key"):
        DibsStore(serializer="pickle")
    block = DibsStore(
        url=f"sqlite:///{tmp_path / 'p.db'}", serializer="pickle", signing_key=SecretStr("k" * 32)
    )
    with block.get_client() as client:
        assert client.run("sets", lambda: {1, 2}) == {1, 2}
        assert client.serializer.name != "json"


def test_get_client_applies_the_settings_and_overrides(tmp_path: Path) -> None:
    block = DibsStore(
        url=f"sqlite:///{tmp_path / 'c.db'}", namespace="team.x", ttl=12, heartbeat_interval=2, max_failures=3
    )
    with block.get_client(ttl=30) as client:
        assert (client.namespace, client.ttl, client.heartbeat_interval, client.max_failures) == (
            "team.x",
            30,
            2,
            3,
        )
        assert client.run("k", lambda: 5) == 5
    assert pickle.loads(pickle.dumps(block)) == block


def test_saved_and_loaded_through_the_api(tmp_path: Path) -> None:
    name = f"saved-{uuid.uuid4().hex[:8]}"
    DibsStore(url=f"sqlite:///{tmp_path / 's.db'}", password=SecretStr("secret"), wait_timeout=3).save(name)
    loaded = DibsStore.load(name)
    assert isinstance(loaded, DibsStore)
    assert loaded.password is not None and loaded.password.get_secret_value() == "secret"
    assert loaded.wait_timeout == 3


def test_prefect_block_register_finds_the_block(child_env: dict[str, str]) -> None:
    from prefect.client.orchestration import get_client

    prefect_cli = [PYTHON, "-m", "prefect"]
    done = subprocess.run(
        [*prefect_cli, "block", "register", "-m", "prefect_dibs"],
        cwd=ROOT,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    with get_client(sync_client=True) as api:
        block_type = api.read_block_type_by_slug("dibs-store")
    assert block_type.name == "Dibs Store"


def test_the_default_store_is_the_environment_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'env.db'}"
    monkeypatch.setenv("DIBS_STORE_URL", url)
    with DibsStore().get_client() as client:
        assert client.store.url == url


def test_a_forked_child_builds_its_own_client(tmp_path: Path) -> None:
    """A cached client holds its store object: the parent's connections are not the child's."""
    from prefect_dibs._clients import clear_cache, resolve_client

    url = f"sqlite:///{tmp_path / 'dibs.db'}"
    try:
        inherited = resolve_client(url)
        assert resolve_client(url) is inherited  # one per URL and settings in a process
        assert in_forked_child(
            lambda: resolve_client(url) is not inherited and resolve_client(url).store is not inherited.store
        )
        assert resolve_client(url) is inherited
    finally:
        clear_cache()


@pytest.mark.parametrize("form", ["cluster", "sentinel"])
def test_a_redis_cluster_or_sentinel_block_reaches_the_store(form: str) -> None:
    """Issue 29: a block takes the topologies' URL forms (several hosts), inserts its password like
    for any server URL, and its client reaches a real cluster or Sentinel set (started by the tests)."""
    from tests.redis_topologies import missing, shared_cluster, shared_sentinels, unique_prefix
    from tests.services import unavailable

    pytest.importorskip("redis", reason="the Redis store needs redis-py (the redis extra)")
    why = missing()
    if why is not None:
        unavailable(f"this test starts its own Redis servers, but {why}")
    topology = shared_cluster() if form == "cluster" else shared_sentinels()
    url = topology.url(unique_prefix())
    with_password = DibsStore(url=url.replace("://", "://dibs@", 1), password=SecretStr("p@ss"))
    assert with_password.store_url() == url.replace("://", "://dibs:p%40ss@", 1)
    client = DibsStore(url=url, namespace="blocks.topology").get_client()
    try:
        assert client.run("k", lambda: "value") == "value"
    finally:
        client.store.close()
        client.close()
