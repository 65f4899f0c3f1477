"""The reliability suite: dibs under faults, with every operation recorded and checked against a model.

A coordination layer is only as trustworthy as the torture it survived. Following the etcd
robustness tests and Jepsen's lock analyses, this package does not assert on a few hand-picked
outcomes: it runs real processes against every store while injecting faults (SIGKILL, SIGSTOP,
cut/slowed/reset connections, a store restart, client clock skew, hostile input), records every
store operation each process performs (:mod:`reliability.history`), and then checks the whole
recorded history against the contract's safety invariants:

* at most one live lease per key at any store instant (and, independently of any clock, no takeover
  sooner than a ttl after the previous holder's last confirmed extension);
* fences only go up for the life of the store, removals included; no write accepted with a stale
  fencing token;
* at most one artifact per key: the first completion wins and is never replaced, unless a
  ``forget`` or ``prune`` may have removed it (and then no artifact is lost or corrupted: see
  :func:`reliability.history.check`);
* every waiter returns (the artifact, the lease, or its own timeout), with the right value.

Records are also removed while all this happens (scenario 7: prune, reap, forget, force_release
with discard; two removers at once, paused removers), and payloads collected (scenario 8: collectors
paused at every step of a collection while other processes publish the same bytes again; no payload
a record names may be lost).

Run it with ``reliability/run`` (full size; writes ``RELIABILITY.md``) or ``reliability/run --ci``
(reduced). ``tests/test_reliability.py`` runs the reduced version under pytest.

Modules: :mod:`~reliability.history` (recording and the checker), :mod:`~reliability.faults` (the
TCP fault proxy, signals, libfaketime), :mod:`~reliability.targets` (one isolated space per store),
:mod:`~reliability.workers` (what child processes run), :mod:`~reliability.scenarios` (the eight
scenarios), :mod:`~reliability.hostile` (the hostile-input cases) and :mod:`~reliability.report`
(``RELIABILITY.md``).
"""
