"""The Redis store's three URL forms (one server, a cluster, a Sentinel set), read without a server.

Opening a store sends nothing (a cluster's client is built at its first operation, a Sentinel's at its
first connection), so every check here is on the URL alone: what each form becomes, and the error
each mistake gets, naming the bad part and the right form, never a password.
"""

from __future__ import annotations

import pytest

from dibs.errors import ConfigurationError
from dibs.stores import STORE_SCHEMES, open_store, redact_url

pytest.importorskip("redis", reason="the redis extra is not installed")
from dibs.stores.redis import RedisStore
from dibs.stores.redis.settings import parse_url


def _parse(url: str):  # type: ignore[no-untyped-def]
    return parse_url(url, redact_url(url))


@pytest.mark.parametrize(
    ("url", "topology", "nodes", "client_url"),
    [
        ("redis://cache:6379/2?prefix=p:", "server", [("cache", 6379)], "redis://cache:6379/2"),
        (
            "redis+cluster://u:pw@n1:7000,n2:7001,[::1]:7002/?prefix=p:&socket_timeout=3",
            "cluster",
            [("n1", 7000), ("n2", 7001), ("::1", 7002)],
            "redis://u:pw@n1:7000/?socket_timeout=3",
        ),
        ("rediss+cluster://n1:7000", "cluster", [("n1", 7000)], "rediss://n1:7000"),
        (
            "redis+sentinel://:pw@s1:26379,s2/3?service_name=main&sentinel_password=spw",
            "sentinel",
            [("s1", 26379), ("s2", 26379)],
            "redis://:pw@s1:26379/3",
        ),
    ],
)
def test_each_form_names_its_nodes_and_hands_redis_py_one_nodes_url(
    url: str, topology: str, nodes: list[tuple[str, int]], client_url: str
) -> None:
    settings = _parse(url)
    assert (settings.topology, list(settings.nodes), settings.client_url) == (topology, nodes, client_url)


def test_sentinel_and_replica_options_are_dibs_own() -> None:
    settings = _parse(
        "redis+sentinel://s1:1,s2:2/0?service_name=main&sentinel_username=su&sentinel_password=spw"
        "&min_replicas=1&replica_timeout=0.5"
    )
    assert (settings.service_name, settings.sentinel_username, settings.sentinel_password) == (
        "main",
        "su",
        "spw",
    )
    assert (settings.min_replicas, settings.replica_timeout) == (1, 0.5)
    assert "min_replicas" not in settings.client_url and "service_name" not in settings.client_url


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("redis+cluster://n1/", "'n1' names no port"),
        ("redis+cluster:///?prefix=p:", "names no node"),
        ("redis+cluster://n1:7000/3", "only database 0, not 3"),
        ("redis+cluster://n1:7000/?db=3", "'db' is not an option of a cluster URL"),
        ("redis+cluster://n1:7000/?read_from_replicas=true", "'read_from_replicas' is not an option"),
        ("redis+cluster://n1:99999/", "not 1 to 65535"),
        ("redis+sentinel://s1:26379/0", "names no service: add ?service_name=NAME"),
        ("redis+sentinel://s1:26379/0?service_name=a&service_name=b", "'service_name' is given twice"),
        ("redis://cache/0?service_name=main", "'service_name' is an option of 'redis+sentinel://' URLs only"),
        ("redis://cache/0?cluster=true", "named by the scheme, 'redis+cluster://'"),
        ("redis://cache/0?min_replicas=-1", "min_replicas='-1' is not a whole number, 0 or more"),
        ("redis://cache/0?replica_timeout=1", "replica_timeout is set without min_replicas"),
        ("redis://cache/0?min_replicas=1&replica_timeout=10", "not below socket_timeout (10 s)"),
        ("redis://cache/0?min_replicas=1&replica_timeout=nan", "replica_timeout"),
        ("redis+sentinel://s1/0?service_name=m&decode_responses=1", "dibs reads replies as bytes"),
        ("redis+cluster://n1:7000/?socket_timeout=soon", "socket_timeout='soon' is not a number"),
    ],
)
def test_a_bad_url_names_what_is_wrong_and_the_forms(url: str, named: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        open_store(url)
    assert named in str(caught.value)
    assert "redis+cluster://" in str(caught.value) and "redis+sentinel://" in str(caught.value)


@pytest.mark.parametrize(
    "url",
    [
        "redis+cluster://dibs:s3cret-pw@n1:7000,n2:7001/?prefix=p:",
        "rediss+cluster://:s3cret-pw@n1:7000/",
        "redis+sentinel://dibs:s3cret-pw@s1:26379,s2:26379/0?service_name=m",
        "redis+sentinel://s1:26379/0?service_name=m&sentinel_password=s3cret-pw",
        "redis+cluster://dibs:s3cret-pw@n1:7000/?no_such_option=1",  # in the error, too
    ],
)
def test_the_new_forms_are_registered_and_never_show_a_password(url: str) -> None:
    assert url.split("://", maxsplit=1)[0] in STORE_SCHEMES
    try:
        store = open_store(url)  # nothing is contacted
    except ConfigurationError as exc:
        shown = str(exc)
    else:
        assert isinstance(store, RedisStore)
        shown = f"{store.url} {store!r}"
        store.close()
    assert "s3cret" not in shown and "***" in shown


def test_a_store_on_an_unreachable_cluster_opens_and_fails_at_its_first_operation() -> None:
    # Opening contacts nothing (the runtime opens stores before any call): the first operation says
    # the cluster did not answer, as a passing failure the callers' policy rides out.
    from dibs.errors import StoreUnavailable
    from dibs.keys import Key

    store = open_store("redis+cluster://127.0.0.1:1,127.0.0.1:2/?socket_connect_timeout=0.5")
    try:
        with pytest.raises(
            StoreUnavailable,
            match=r"Redis Cluster at redis\+cluster://127.0.0.1:1,127.0.0.1:2/\S* did not answer",
        ):
            store.read(Key("unit.redis", "k"))
    finally:
        store.close()
