"""The reliability suite (``reliability/``) at its reduced size, on every available store.

The same scenarios as ``reliability/run --ci``: processes racing, holders SIGKILLed and SIGSTOPped,
connections cut through a fault proxy, client clocks skewed with libfaketime, hostile input. Every
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
    store.acquire(key, "someone", 60, None)
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
