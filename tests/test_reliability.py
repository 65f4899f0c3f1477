"""The reliability suite (``reliability/``) at its reduced size, on every available store.

The same scenarios as ``reliability/run --ci``: processes racing, holders SIGKILLed and SIGSTOPped,
connections cut through a fault proxy, client clocks skewed with libfaketime, hostile input,
records removed (prune, reap, forget, force_release + discard, by two removers at once and a paused
one) while processes compute the same keys, and payloads collected likewise (a collector paused at
each step of its collections) while those keys publish the same bytes again. Every
store operation is recorded and the history is checked against the contract's invariants; these
tests assert that no *unexpected* violation was found. Expected ones (the local-clock stores under
clock skew, a documented limit) are allowed, and latencies are never asserted: the measured figures
go to ``RELIABILITY.md`` (``reliability/run``), not to pass/fail.

Stores come from the same variables as the rest of the suite and skip (or, under
``DIBS_REQUIRE_SERVICES=1``, fail) when absent; so does the clock-skew scenario without libfaketime
(``scripts/install-faketime.sh``). ``DIBS_RELIABILITY_SEED`` replays another seed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from reliability import scenarios, targets
from reliability.scenarios import CI, Launcher, ScenarioResult

from dibs.stores import AcquireRequest
from tests.services import unavailable

SEED = int(os.environ.get("DIBS_RELIABILITY_SEED", "20261125"))
WITHOUT_SKEW = [name for name in scenarios.SCENARIOS if name != "skew"]


@pytest.fixture(scope="module")
def launcher() -> Iterator[Launcher]:
    launcher = Launcher()
    yield launcher
    launcher.reap()
    targets.stop_azurite()


@pytest.fixture(params=targets.ALL_STORES)
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[targets.Target]:
    try:
        target = targets.open_target(request.param, tmp_path / "space", defaults=False)
    except targets.TargetUnavailable as exc:
        unavailable(f"reliability suite on {request.param}: {exc}")
    try:
        yield target
    finally:
        target.close()


def _run(
    name: str, target: targets.Target, tmp_path: Path, launcher: Launcher, offset: int
) -> ScenarioResult:
    return scenarios.run_scenario(name, target, CI, tmp_path / name, launcher=launcher, seed=SEED + offset)


def _problems(results: list[ScenarioResult]) -> str:
    return "\n".join(f"{r.store}/{r.scenario}: {v}" for r in results for v in r.unexpected)


def test_reduced_reliability_suite_finds_no_violation(
    target: targets.Target, tmp_path: Path, launcher: Launcher
) -> None:
    results = [_run(name, target, tmp_path, launcher, i) for i, name in enumerate(WITHOUT_SKEW)]
    assert not _problems(results), _problems(results)
    ran = [r for r in results if not r.skipped]
    assert all(r.trials > 0 for r in ran), [(r.scenario, r.trials) for r in ran]
    kill = next(r for r in results if r.scenario == "kill")
    assert kill.faults["SIGKILL"] > 0  # the scenario really killed holders
    # The removers really removed while the others computed, and really were paused and stopped.
    removal = next(r for r in results if r.scenario == "removal")
    removed = removal.figures["removals"]
    for kind in ("prune", "reap", "forget", "force_release+discard"):
        assert removed.get(f"{kind} calls", 0) > 0, removed
    assert removed.get("prune that removed", 0) > 0, removed  # the others may find nothing to do
    assert removal.faults["paused removals"] > 0, removal.faults
    assert removal.faults["SIGSTOP remover"] > 0, removal.faults
    # The payload collectors really collected, removed copies, and were paused and stopped.
    payloads = next(r for r in results if r.scenario == "payloads")
    collected = payloads.figures["removals"]
    assert collected.get("collect calls", 0) > 0 and collected.get("copies removed", 0) > 0, collected
    assert payloads.faults["paused collections"] > 0, payloads.faults
    assert payloads.faults["SIGSTOP remover"] > 0, payloads.faults


def test_reduced_clock_skew_finds_no_unexpected_violation(
    target: targets.Target, tmp_path: Path, launcher: Launcher
) -> None:
    result = _run("skew", target, tmp_path, launcher, len(WITHOUT_SKEW))
    if result.skipped:
        unavailable(f"clock skew on {target.name}: {result.skipped}")
    assert not _problems([result]), _problems([result])
    assert result.figures["measured_skew_seconds"] == pytest.approx(scenarios.SKEW_SECONDS, abs=30)
    if not target.local_clock:
        assert not result.expected  # only the local-clock stores have a documented limit here


def test_the_folder_check_accepts_what_a_killed_writer_leaves_and_flags_names_made_from_keys(
    tmp_path: Path,
) -> None:
    """The hostile scenario's "no path traversal" check runs on the folder that the kill scenario
    used: a writer SIGKILLed between staging a record and renaming it leaves its hidden ``.tmp`` file
    there (harmless, documented by the file store). That is no violation; a key-named file is."""
    from reliability.hostile import stray_files

    from dibs.keys import Key
    from dibs.stores.filesystem import FileStore

    store = FileStore(tmp_path / "store")
    key = Key("rel.hostile", "features-2026-11-25")
    store.acquire(key, AcquireRequest("someone", 60))
    FileStore._stage(store.record_path(key), b"{}")  # a writer killed before its rename stops here
    FileStore._stage(store.artifact_path(key, 1), b"payload")
    assert stray_files(tmp_path) == []

    (store.root / "records" / "features-2026-11-25.json").write_text("{}")
    (store.root / "records" / f".{key.name}.json.0123456789abcdef.tmp").write_text("{}")
    (tmp_path / "outside").write_text("")
    assert stray_files(tmp_path) == [
        Path("outside"),
        Path("store/records/.features-2026-11-25.json.0123456789abcdef.tmp"),
        Path("store/records/features-2026-11-25.json"),
    ]


# -- the checker on hand-written histories: each removal rule can fail, and removals excuse only
# what they may do ------------------------------------------------------------------------------------


def _grant(proc: str, fence: int, t0: float, *, ttl: float = 10.0) -> dict[str, object]:
    return {
        "proc": proc,
        "op": "acquire",
        "key": "k",
        "t0": t0,
        "t1": t0 + 0.01,
        "result": "granted",
        "owner": f"{proc}/k/0",
        "fence": fence,
        "lease": f"lease-{proc}-{fence}",
        "acquired_at": 1000 + t0,
        "expires_at": 1000 + t0 + ttl,
        "ttl": ttl,
    }


def _complete(grant: dict[str, object], t0: float) -> dict[str, object]:
    artifact = {
        "fence": grant["fence"],
        "checksum": "c",
        "producer": grant["owner"],
        "created_at": 0,
        "size": 1,
    }
    return {
        "proc": grant["proc"],
        "op": "complete",
        "key": "k",
        "t0": t0,
        "t1": t0 + 0.01,
        "result": "ok",
        "fence": grant["fence"],
        "lease": grant["lease"],
        "at": 1000 + t0,
        "artifact": artifact,
    }


def _removal(op: str, t0: float, **fields: object) -> dict[str, object]:
    return {"proc": "remover", "op": op, "t0": t0, "t1": t0 + 0.01, "result": "ok", "changed": True, **fields}


def _found(events: list[dict[str, object]]) -> list[str]:
    from reliability import history

    violations, _ = history.check(events, history.Expectations())  # type: ignore[arg-type]
    return sorted({v.invariant for v in violations})


def test_the_checker_flags_a_fence_that_a_removal_sent_backwards() -> None:
    first = _grant("a", 3, 0.0)
    events = [first, _complete(first, 1.0), _removal("prune", 2.0), _grant("b", 1, 3.0)]
    assert _found(events) == ["fencing"]
    read = {"proc": "c", "op": "read", "key": "k", "t0": 4.0, "t1": 4.01, "result": "ok", "key_fence": 0}
    assert _found([first, _complete(first, 1.0), _removal("prune", 2.0), read]) == ["fencing"]
    assert _found([first, _complete(first, 1.0), _removal("prune", 2.0), _grant("b", 4, 3.0)]) == []


def test_the_checker_lets_an_artifact_go_only_through_a_forget_or_prune() -> None:
    first = _grant("a", 1, 0.0)
    second = _grant("b", 2, 3.0)
    stored = [first, _complete(first, 1.0), second, _complete(second, 4.0)]
    assert _found(stored) == ["no lost artifact", "single artifact"]
    assert _found([*stored, _removal("forget", 2.0, key="k")]) == []
    assert _found([*stored, _removal("prune", 2.0, namespace="rel.removal")]) == []
    # reap and discard never take an artifact away, and a forget after the second grant is too late
    assert "no lost artifact" in _found([*stored, _removal("reap", 2.0), _removal("discard", 2.0, key="k")])
    assert "no lost artifact" in _found([*stored, _removal("forget", 3.5, key="k")])
    # a forget that changed nothing removed nothing
    assert "no lost artifact" in _found([*stored, _removal("forget", 2.0, key="k", changed=False)])


def test_the_checker_excuses_an_overlap_after_a_force_release_but_no_other_removal() -> None:
    first = _grant("a", 1, 0.0, ttl=10.0)
    second = _grant("b", 2, 3.0, ttl=10.0)  # granted while the first one's lease still ran
    assert "exclusion (store clock)" in _found([first, second, _removal("prune", 2.0)])
    assert "exclusion (store clock)" in _found([first, second, _removal("reap", 2.0)])
    assert _found([first, second, _removal("force_release", 2.0, key="k")]) == []
    # the force-released holder's heartbeat, accepted after the new grant, is a stale write
    beat = {**first, "op": "heartbeat", "t0": 4.0, "t1": 4.01, "result": "ok"}
    assert _found([first, second, _removal("force_release", 2.0, key="k"), beat]) == ["stale write accepted"]


def test_the_checker_flags_a_complete_refused_as_lost_whose_artifact_was_stored() -> None:
    first = _grant("a", 1, 0.0, ttl=10.0)
    refused = {**_complete(first, 1.0), "result": "lost", "checksum": "c"}
    del refused["artifact"]
    hit = {**_complete(first, 2.0), "proc": "b", "op": "acquire", "result": "present"}
    assert _found([first, refused]) == []
    # Its artifact was there after all: a wrong outcome, and the lease counts as ended by it, so a
    # grant after a prune of that artifact is no exclusion violation.
    events = [first, refused, hit, _removal("prune", 3.0), _grant("c", 2, 4.0)]
    assert _found(events) == ["complete outcome"]


def _log(proc: str, key: str, t0: float) -> dict[str, object]:
    message = f"rel.payloads/{key}: its artifact is treated as missing, and the key computes again: gone"
    return {
        "proc": proc,
        "op": "log",
        "level": "WARNING",
        "logger": "dibs.payloads",
        "msg": message,
        "t0": t0,
    }


def test_the_payload_miss_check_excuses_only_a_forget_of_the_key_after_its_artifact() -> None:
    from reliability import history

    first = _grant("a", 1, 0.0)
    stored = {**_complete(first, 1.0), "key": "k"}
    miss = _log("b", "k", 3.0)
    assert [v.invariant for v in history.payload_misses([first, stored, miss])[0]] == ["no lost payload"]
    forget = _removal("forget", 2.0, key="k")
    assert history.payload_misses([first, stored, forget, miss]) == ([], 1, 1)
    # a forget before the artifact was stored, of another key, or one that changed nothing excuses nothing
    for other in (
        _removal("forget", 0.5, key="k"),
        _removal("forget", 2.0, key="other"),
        _removal("forget", 2.0, key="k", changed=False),
    ):
        violations, misses, excused = history.payload_misses([first, stored, other, miss])
        assert (len(violations), misses, excused) == (1, 1, 0), other
