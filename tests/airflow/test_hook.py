"""The ``dibs`` connection: parsing, fallbacks, credentials, and clear errors for bad connections."""

from __future__ import annotations

import asyncio
import io
import json
import re
import sys
import uuid
from typing import Any

import pytest

pytest.importorskip("airflow")

from airflow.sdk import Connection

from dibs import ConfigurationError
from dibs_provider.hooks.dibs import DibsHook, settings_from_connection


def conn(extra: dict[str, Any] | None = None, **fields: Any) -> Connection:
    fields.setdefault("conn_type", "dibs")
    return Connection(conn_id="dibs_test", extra=json.dumps(extra) if extra is not None else None, **fields)


def env_conn(monkeypatch: pytest.MonkeyPatch, conn_id: str, value: dict[str, Any] | str) -> None:
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}", value if isinstance(value, str) else json.dumps(value)
    )


def test_full_connection_is_parsed() -> None:
    settings = settings_from_connection(
        conn(
            {"store_url": "postgresql+psycopg://dibs@db:5432/dibs", "namespace": "team.features", "ttl": 90},
            password="p@ss/word",
        )
    )
    assert settings.store_url == "postgresql+psycopg://dibs:p%40ss%2Fword@db:5432/dibs"
    assert "p%40ss" not in repr(settings) and "***" in settings.display_url
    assert (settings.namespace, settings.ttl) == ("team.features", 90.0)
    assert settings.settings.heartbeat_interval is None


def test_spaces_around_the_urls_are_ignored() -> None:
    # A URL pasted into the form with a space: its scheme is read without it, as the URL is used.
    settings = settings_from_connection(
        conn({"store_url": " sqlite:////x.db ", "payloads_url": " file:///shared/dibs "})
    )
    assert (settings.store_url, settings.payloads_url) == ("sqlite:////x.db", "file:///shared/dibs")


def test_uri_style_extras_are_text_and_still_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    env_conn(
        monkeypatch, "dibs_uri", "dibs://?store_url=sqlite%3A%2F%2F%2F%2Ftmp%2Fx.db&ttl=20&wait_timeout=5"
    )
    settings = DibsHook("dibs_uri").get_settings()
    assert (settings.store_url, settings.ttl, settings.wait_timeout) == ("sqlite:////tmp/x.db", 20.0, 5.0)


def test_prefixed_extras_from_older_forms_are_accepted() -> None:
    settings = settings_from_connection(conn({"extra__dibs__store_url": "sqlite:////tmp/y.db"}))
    assert settings.store_url == "sqlite:////tmp/y.db"


def test_default_connection_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'from-conn.db'}"
    env_conn(monkeypatch, "dibs_default", {"conn_type": "dibs", "extra": {"store_url": url}})
    hook = DibsHook()
    assert hook.get_settings().store_url == url
    with hook.get_client() as client:
        assert client.store.url == url


def test_without_connection_falls_back_to_dibs_store_url(store_url: str) -> None:
    settings = DibsHook().get_settings()
    assert settings.store_url == store_url
    assert "DIBS_STORE_URL" in settings.source


def test_without_connection_or_env_uses_the_embedded_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DIBS_STORE_URL", raising=False)
    settings = DibsHook().get_settings()
    assert settings.store_url.startswith("sqlite:///") and "embedded default" in settings.source


def test_empty_store_url_in_connection_falls_back_too(store_url: str) -> None:
    settings = settings_from_connection(conn({"namespace": "x"}))
    assert settings.store_url == store_url and "store_url empty" in settings.source


def test_an_explicit_connection_that_does_not_exist_is_an_error(store_url: str) -> None:
    with pytest.raises(ConfigurationError, match="'dibs_missing' is not defined"):
        DibsHook("dibs_missing").get_settings()


def test_async_settings_read_the_same_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    env_conn(monkeypatch, "dibs_async", {"conn_type": "dibs", "extra": {"store_url": "sqlite:////tmp/a.db"}})
    settings = asyncio.run(DibsHook("dibs_async").aget_settings())
    assert settings.store_url == "sqlite:////tmp/a.db"


@pytest.mark.parametrize(
    ("connection", "field", "hint"),
    [
        (conn({"store_url": "not a url"}), "extra 'store_url'", "postgresql+psycopg://"),
        (conn({"store_url": "ftp://x/y"}), "extra 'store_url'", "known schemes"),
        (conn({"store_url": "sqlite:////x.db", "ttl": "soon"}), "extra 'ttl'", "number of seconds"),
        (conn({"store_url": "sqlite:////x.db", "ttl": -1}), "extra 'ttl'", "greater than 0"),
        (
            conn({"store_url": "sqlite:////x.db", "ttl": 10, "heartbeat_interval": 10}),
            "heartbeat_interval",
            "shorter",
        ),
        (conn({"store_url": "sqlite:////x.db", "namespace": "a b"}), "extra 'namespace'", "dot-separated"),
        (conn({"store_url": "sqlite:////x.db", "storeurl": "x"}), "extra", "understands store_url"),
        (conn({"store_url": "sqlite:////x.db"}, host="db"), "host", "extra 'store_url'"),
        (conn({"store_url": "sqlite:////x.db"}, password="secret-pw"), "password", "no server password"),
        (
            conn({"store_url": "postgresql://u:old@db/x"}, password="secret-pw"),
            "password",
            "only in the Password",
        ),
        (conn({"store_url": "sqlite:////x.db"}, conn_type="postgres"), "conn_type", "use conn_type 'dibs'"),
    ],
)
def test_bad_connections_name_the_field_and_the_fix(connection: Connection, field: str, hint: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        settings_from_connection(connection)
    message = str(info.value)
    assert "dibs connection 'dibs_test'" in message and field in message and hint in message
    assert "secret-pw" not in message


def test_core_rules_name_the_connection_and_the_field() -> None:
    # heartbeat_interval without a ttl is checked against the core's default ttl, by the core's rule
    with pytest.raises(ConfigurationError, match=r"connection 'dibs_test'.*heartbeat_interval.*60s"):
        settings_from_connection(conn({"store_url": "sqlite:////tmp/z.db", "heartbeat_interval": 600}))
    settings = settings_from_connection(conn({"store_url": "sqlite:////tmp/z.db", "heartbeat_interval": 20}))
    with pytest.raises(ConfigurationError, match=r"connection 'dibs_test'.*heartbeat_interval"):
        settings.client(ttl=10)  # an operator's own ttl, shorter than the connection's heartbeat


def test_test_connection_reports_success_and_failure(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    env_conn(
        monkeypatch, "dibs_ok", {"conn_type": "dibs", "extra": {"store_url": f"sqlite:///{tmp_path}/ok.db"}}
    )
    ok, message = DibsHook("dibs_ok").test_connection()
    assert ok and "reachable" in message
    env_conn(
        monkeypatch, "dibs_bad", {"conn_type": "dibs", "extra": {"store_url": "sqlite:////x.db", "ttl": "x"}}
    )
    ok, message = DibsHook("dibs_bad").test_connection()
    assert not ok and "ConfigurationError" in message and "'ttl'" in message


def test_a_failed_test_keeps_its_install_hint_through_airflows_cli_markup(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``airflow connections test`` prints the message as Rich markup, where ``[postgres]`` is a style tag
    and would vanish: the hint must read the same there as in the UI, and still install the extra."""
    from packaging.requirements import Requirement
    from rich.console import Console

    monkeypatch.setitem(sys.modules, "psycopg", None)  # the driver is not installed
    url = f"postgresql+psycopg://dibs@127.0.0.1:1/hint-{uuid.uuid4().hex[:8]}"
    env_conn(monkeypatch, "dibs_pg", {"conn_type": "dibs", "extra": {"store_url": url}})
    ok, message = DibsHook("dibs_pg").test_connection()
    assert not ok
    console = Console(file=io.StringIO(), width=1000)
    console.print(f"[bold][red]\nConnection failed![/bold]\n{message}\n")  # what the CLI does with it
    shown = console.file.getvalue()  # type: ignore[attr-defined]
    (command,) = re.findall(r"pip install '([^']+)'", shown)
    assert command in message  # the UI shows the message as it is: the same text
    requirement = Requirement(command)
    assert (requirement.name, requirement.extras) == ("dibs", {"postgres"})


def test_hooks_starting_together_share_one_connection_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    """A triggerer starting many triggers at once looks their connection up once (issue 20), and a
    hook that starts after that lookup has ended looks it up again (a changed connection is seen)."""
    env_conn(monkeypatch, "dibs_many", {"conn_type": "dibs", "extra": {"store_url": "sqlite:////tmp/m1.db"}})
    lookups: list[str] = []
    original = DibsHook.aget_connection

    async def counted(conn_id: str) -> Connection:
        lookups.append(conn_id)
        return await original(conn_id)  # type: ignore[no-any-return]

    monkeypatch.setattr(DibsHook, "aget_connection", staticmethod(counted))

    async def scenario() -> tuple[list[Any], Any]:
        together = await asyncio.gather(*(DibsHook("dibs_many").aget_settings() for _ in range(200)))
        env_conn(
            monkeypatch, "dibs_many", {"conn_type": "dibs", "extra": {"store_url": "sqlite:////tmp/m2.db"}}
        )
        later = await DibsHook("dibs_many").aget_settings()
        return together, later

    together, later = asyncio.run(scenario())
    assert {settings.store_url for settings in together} == {"sqlite:////tmp/m1.db"}
    assert later.store_url == "sqlite:////tmp/m2.db"
    assert lookups == ["dibs_many", "dibs_many"]


def test_triggers_handed_one_connection_together_parse_it_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A thousand deferred tasks hand their triggers the same connection: the triggers that start
    together parse it once (one hop to asgiref's thread, one "dibs store" line, not one each, issue
    30); another connection handed under the same id is parsed apart, and so is one handed later."""
    parsed: list[str] = []
    original = DibsHook._settings_from

    def counted(self: DibsHook, conn: Any, how: str = "") -> Any:
        parsed.append(conn.extra)
        return original(self, conn, how)

    monkeypatch.setattr(DibsHook, "_settings_from", counted)
    one = {"conn_type": "dibs", "extra": json.dumps({"store_url": "sqlite:////tmp/h1.db"})}
    other = {"conn_type": "dibs", "extra": json.dumps({"store_url": "sqlite:////tmp/h2.db"})}

    async def scenario() -> tuple[list[Any], Any]:
        handed = [DibsHook("dibs_handed").aget_settings(dict(one)) for _ in range(200)]
        handed.append(DibsHook("dibs_handed").aget_settings(dict(other)))
        together = await asyncio.gather(*handed)
        later = await DibsHook("dibs_handed").aget_settings(dict(one))
        return together, later

    together, later = asyncio.run(scenario())
    assert [settings.store_url for settings in together] == ["sqlite:////tmp/h1.db"] * 200 + [
        "sqlite:////tmp/h2.db"
    ]
    assert later.store_url == "sqlite:////tmp/h1.db"
    assert sorted(parsed) == sorted([one["extra"], other["extra"], one["extra"]])


def test_a_failed_shared_lookup_fails_every_hook_that_waited_for_it(store_url: str) -> None:
    async def scenario() -> list[Any]:
        hooks = [DibsHook("dibs_missing_many").aget_settings() for _ in range(100)]
        return await asyncio.gather(*hooks, return_exceptions=True)

    errors = asyncio.run(scenario())
    assert all(isinstance(error, ConfigurationError) for error in errors)
    assert "'dibs_missing_many' is not defined" in str(errors[0])


def test_triggers_waiting_on_one_connection_share_one_client(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """A thousand deferred tasks on one connection cost one client, not one each (issue 20): the
    hooks of one connection, namespace and ttl get the same client while any of them uses it; the
    last to close it closes it; another namespace or a changed connection gets a client of its own."""
    env_conn(
        monkeypatch,
        "dibs_shared",
        {"conn_type": "dibs", "extra": {"store_url": f"sqlite:///{tmp_path}/s1.db"}},
    )

    async def scenario() -> None:
        clients = await asyncio.gather(*(DibsHook("dibs_shared").aget_client() for _ in range(50)))
        assert len({id(client.client) for client in clients}) == 1
        shared = clients[0]
        other = await DibsHook("dibs_shared", namespace="elsewhere").aget_client()
        assert other.client is not shared.client and other.client.namespace == "elsewhere"
        await DibsHook.aclose(other)
        assert other.client._closed
        for client in clients[:-1]:
            await DibsHook.aclose(client)
        assert not shared.client._closed  # one trigger still uses it
        later = await DibsHook("dibs_shared").aget_client()
        assert later.client is shared.client  # a later trigger joins it
        await DibsHook.aclose(later)
        await DibsHook.aclose(clients[-1])
        assert shared.client._closed  # its last user gave it back
        env_conn(
            monkeypatch,
            "dibs_shared",
            {"conn_type": "dibs", "extra": {"store_url": f"sqlite:///{tmp_path}/s2.db"}},
        )
        fresh = await DibsHook("dibs_shared").aget_client()
        assert fresh is not shared and not fresh.client._closed
        assert fresh.client.store.url.endswith("s2.db")
        await DibsHook.aclose(fresh)
        assert fresh.client._closed

    asyncio.run(scenario())


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="fork is POSIX")
def test_a_forked_child_shares_none_of_the_parents_clients_nor_waits_for_its_lock() -> None:
    """A triggerer thread giving a client back (holding the table's lock) as the process forks: the
    child starts with a lock of its own and an empty table (the parent's stores are not its own)."""
    import os
    import signal
    import time

    from dibs_provider.hooks import dibs as hook_module

    shared = hook_module._SHARED_CLIENTS
    share = ("a connection's settings", "ns", None, None)
    with shared._lock:
        shared._clients[share] = [object(), 1]
        try:
            pid = os.fork()
            if pid == 0:  # the child: never returns into pytest
                code = 1
                try:
                    got = hook_module._SHARED_CLIENTS._lock.acquire(timeout=5)
                    if got:
                        hook_module._SHARED_CLIENTS._lock.release()
                        code = 0 if hook_module._SHARED_CLIENTS.take(share) is None else 2
                finally:
                    os._exit(code)
        finally:
            del shared._clients[share]
    deadline, code = time.monotonic() + 20, -1
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert code == 0


def test_a_trigger_giving_its_client_back_twice_gives_back_one_share(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """Closing twice must not take another trigger's share away (its client closed under its wait)."""
    from dibs_provider.hooks import dibs as hook_module

    env_conn(
        monkeypatch, "dibs_twice", {"conn_type": "dibs", "extra": {"store_url": f"sqlite:///{tmp_path}/t.db"}}
    )

    async def scenario() -> None:
        first = await DibsHook("dibs_twice").aget_client()
        second = await DibsHook("dibs_twice").aget_client()
        assert first.client is second.client
        await DibsHook.aclose(first)
        await DibsHook.aclose(first)
        assert not second.client._closed  # still the second trigger's
        await DibsHook.aclose(second)
        assert second.client._closed
        assert not hook_module._SHARED_CLIENTS._clients and not hook_module._SHARED_CLIENTS._handles

    asyncio.run(scenario())


def test_a_client_closed_by_hand_is_never_handed_to_a_new_trigger(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    from dibs_provider.hooks import dibs as hook_module

    env_conn(
        monkeypatch,
        "dibs_byhand",
        {"conn_type": "dibs", "extra": {"store_url": f"sqlite:///{tmp_path}/h.db"}},
    )

    async def scenario() -> None:
        first = await DibsHook("dibs_byhand").aget_client()
        first.client.close()  # a user closing the client itself, not through the hook
        fresh = await DibsHook("dibs_byhand").aget_client()
        assert fresh.client is not first.client and not fresh.client._closed
        await DibsHook.aclose(first)
        assert not fresh.client._closed
        await DibsHook.aclose(fresh)
        assert fresh.client._closed
        assert not hook_module._SHARED_CLIENTS._clients and not hook_module._SHARED_CLIENTS._handles

    asyncio.run(scenario())


def test_triggers_sharing_a_client_outlive_one_that_fails_and_one_cancelled(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    from dibs_provider.hooks import dibs as hook_module

    env_conn(
        monkeypatch, "dibs_fail", {"conn_type": "dibs", "extra": {"store_url": f"sqlite:///{tmp_path}/f.db"}}
    )

    async def scenario() -> None:
        joined, release = asyncio.Event(), asyncio.Event()
        holding: list[Any] = []

        async def trigger(fails: bool) -> bool:
            client = await DibsHook("dibs_fail").aget_client()
            holding.append(client)
            try:
                await joined.wait()  # all five share it before any ends
                if fails:
                    raise RuntimeError("this trigger failed")
                await release.wait()
                return bool(client.client._closed)
            finally:
                await DibsHook.aclose(client)
                await DibsHook.aclose(client)  # a careless trigger closing twice

        waiting = [asyncio.create_task(trigger(False)) for _ in range(3)]
        failing = asyncio.create_task(trigger(True))
        cancelled = asyncio.create_task(trigger(False))
        while len(holding) < 5:
            await asyncio.sleep(0.01)
        assert len({id(client.client) for client in holding}) == 1
        joined.set()
        with pytest.raises(RuntimeError):
            await failing
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert not holding[0].client._closed
        release.set()
        assert await asyncio.gather(*waiting) == [False, False, False]  # none saw its client closed
        assert holding[0].client._closed
        assert not hook_module._SHARED_CLIENTS._clients and not hook_module._SHARED_CLIENTS._handles

    asyncio.run(scenario())


def test_a_trigger_cancelled_while_its_client_is_built_closes_that_client(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    import threading

    from dibs_provider.hooks import dibs as hook_module

    env_conn(
        monkeypatch, "dibs_built", {"conn_type": "dibs", "extra": {"store_url": f"sqlite:///{tmp_path}/b.db"}}
    )
    building, go_on, built = threading.Event(), threading.Event(), []
    client_of = hook_module.DibsSettings.client

    def slow_client(self: Any, **kwargs: Any) -> Any:
        building.set()
        go_on.wait(10)
        built.append(client_of(self, **kwargs))
        return built[-1]

    monkeypatch.setattr(hook_module.DibsSettings, "client", slow_client)

    async def scenario() -> None:
        task = asyncio.create_task(DibsHook("dibs_built").aget_client())
        while not building.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        go_on.set()
        for _ in range(500):  # bounded: until the build has ended and its callback ran
            if built and built[0]._closed:
                break
            await asyncio.sleep(0.01)
        assert built and built[0]._closed

    asyncio.run(scenario())


@pytest.mark.parametrize("form", ["cluster", "sentinel"])
def test_a_redis_cluster_or_sentinel_url_with_the_password_field_reaches_the_store(form: str) -> None:
    """Issue 29: the topologies' URL forms pass the connection's check, take the Password field like
    any server URL, and reach a real cluster or Sentinel set (started by the tests)."""
    from tests.redis_topologies import missing, shared_cluster, shared_sentinels, unique_prefix
    from tests.services import unavailable

    pytest.importorskip("redis", reason="the Redis store needs redis-py (the redis extra)")
    why = missing()
    if why is not None:
        unavailable(f"this test starts its own Redis servers, but {why}")
    topology = shared_cluster() if form == "cluster" else shared_sentinels()
    prefix = unique_prefix()
    url, password = topology.url(prefix), f"pw-{uuid.uuid4().hex}"
    settings = settings_from_connection(
        conn({"store_url": url.replace("://", "://dibs@", 1)}, password=password)
    )
    assert settings.store_url == url.replace("://", f"://dibs:{password}@", 1)
    assert password not in settings.display_url and settings.display_url.startswith(
        f"redis+{form}://dibs:***@"
    )
    # The servers have no password: reach them with the URL as given, through the same client.
    client = settings_from_connection(conn({"store_url": url})).client()
    try:
        assert client.run("k", lambda: "value") == "value"
        assert [state.key.name for state in client.store.list()] == ["k"]
    finally:
        client.store.close()
        client.close()
