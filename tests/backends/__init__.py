"""One module per store, each giving an isolated store URL for a test.

A backend module defines ``isolated_url(tmp_path) -> contextmanager[str]``: a URL naming a fresh,
empty space on that store (a new SQLite file, a new PostgreSQL schema, a new Redis key prefix, a new
blob container) that is removed afterwards, so reruns against long-lived servers never collide.
Adding a store to every contract and multi-process test is: write its module, add its name here.
"""

BACKENDS = ["memory", "sqlite", "postgres", "mysql", "file", "redis", "azure"]

#: Backends whose space is shared across OS processes (``memory`` is one process only).
PROCESS_BACKENDS = [name for name in BACKENDS if name != "memory"]

#: The Redis store on the other topologies it reaches (a Redis Cluster, a Sentinel set: servers the
#: tests start, ``tests/redis_topologies.py``). They run the store contract and the model test
#: (``tests/contract``); what differs between topologies (listing every node, failovers, the URL
#: forms, the multi-process races) is tested in ``tests/test_redis_topologies.py``, not through
#: every test of every store (the same store class and scripts run there on the one server). A cluster
#: keeps the namespaces' indexes only under a prefix with a hash tag: ``redis_cluster_tagged``.
TOPOLOGY_BACKENDS = ["redis_cluster", "redis_cluster_tagged", "redis_sentinel"]

#: Every backend the store contract runs on.
CONTRACT_BACKENDS = BACKENDS + TOPOLOGY_BACKENDS
