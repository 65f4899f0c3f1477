"""The ``dibs`` command, driven as users drive it: real subprocesses on real stores.

Stopping it with signals is in ``test_cli_stops.py``; what a waiter shows in
``test_cli_progress.py``.
"""

from __future__ import annotations

import base64
import contextlib
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

import dibs as lib
from tests.cli_harness import DIBS, eventually, on_terminal, running
from tests.cli_harness import dibs as run_dibs

#: A Unix time in seconds (10 digits, 2001 to 2286): no message of the command may show one.
RAW_EPOCH = re.compile(r"\b[1-9]\d{9}(\.\d+)?\b")


def dibs(*args: str, store: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run_dibs(*args, store=store, check=check)


@pytest.fixture
def store(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


def envelope(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


# -- run and wait -------------------------------------------------------------------------------------


def test_concurrent_runs_execute_the_command_once_and_all_print_its_output(
    store: str, tmp_path: Path
) -> None:
    log = tmp_path / "executions.log"
    script = (
        "import pathlib, time; "
        f"pathlib.Path({str(log)!r}).open('a').write('ran\\n'); "
        "time.sleep(1.5); print('features: 1234 rows'); print('checksum: abc')"
    )
    command = [
        *DIBS,
        "run",
        "--store",
        store,
        "--key",
        "features-2026-11-25",
        "--",
        sys.executable,
        "-c",
        script,
    ]
    runs = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(5)
    ]
    outputs = [run.communicate(timeout=120) for run in runs]
    assert [run.returncode for run in runs] == [0] * 5, [err for _, err in outputs]
    assert log.read_text() == "ran\n"
    assert {out for out, _ in outputs} == {"features: 1234 rows\nchecksum: abc\n"}

    later = dibs("run", "--key", "features-2026-11-25", "--", "false", store=store)
    assert later.stdout == "features: 1234 rows\nchecksum: abc\n"  # stored output, `false` never ran


def test_a_failing_command_keeps_its_status_and_frees_the_key(store: str) -> None:
    failed = dibs(
        "run", "--key", "k", "--", sys.executable, "-c", "import sys; sys.exit(3)", store=store, check=False
    )
    assert failed.returncode == 3
    shown = json.loads(dibs("show", "k", "--json", store=store).stdout)
    assert shown["status"] == "failed" and shown["failures"] == 1 and "status 3" in shown["last_error"]
    assert dibs("run", "--key", "k", "--", "echo", "second", store=store).stdout == "second\n"


def test_a_command_killed_by_a_signal_or_never_started_is_a_recorded_failure(store: str) -> None:
    killed = dibs("run", "--key", "killed", "--", "sh", "-c", "kill -KILL $$", store=store, check=False)
    assert killed.returncode == 128 + 9, killed.stderr
    client = lib.Reservations(store)
    recorded = client.status("killed").failure
    assert (
        recorded is not None and recorded.error == "command \"sh -c 'kill -KILL $$'\" was killed by SIGKILL"
    )

    missing = dibs("run", "--key", "missing", "--", "/nonexistent/build.sh", store=store, check=False)
    assert missing.returncode == 127
    assert missing.stderr.count("\n") == 1 and "could not start" in missing.stderr
    recorded = client.status("missing").failure
    assert recorded is not None and "could not start" in recorded.error


def test_json_envelopes_say_how_each_invocation_got_the_value(store: str, tmp_path: Path) -> None:
    go, started = tmp_path / "go", tmp_path / "started"
    holder_script = "\n".join(
        [
            "import pathlib, sys, time",
            "pathlib.Path(sys.argv[1]).touch()",
            "while not pathlib.Path(sys.argv[2]).exists(): time.sleep(0.02)",
            "print('features: 1234 rows')",
        ]
    )
    holder_args = ("run", "--store", store, "--json", "--key", "day", "--owner", "holder-1")
    with running(*holder_args, "--", sys.executable, "-c", holder_script, str(started), str(go)) as holder:
        eventually(started.exists, "the holder's command to start")
        with (
            running("--json", "-v", "run", "--store", store, "--key", "day", "--", "false") as waiting_run,
            running("wait", "day", "--store", store, "--json", "-v") as waiting_wait,
        ):
            for waiter in (waiting_run, waiting_wait):
                waiter.wait_for_line('"holder": "holder-1"')
            go.touch()
            assert [holder.finish(), waiting_run.finish(), waiting_wait.finish()] == [0, 0, 0]

    computed = json.loads(holder.stdout)
    assert computed == {
        "key": "default/day",
        "role": "computed",
        "token": computed["token"],
        "producer": "holder-1",
        "waited_seconds": 0.0,
        "waited_on": None,
        "took_over_from": None,
        "stored": True,
        "encoding": "utf-8",
        "value": "features: 1234 rows\n",
    }
    assert isinstance(computed["token"], int)
    for waiter in (waiting_run, waiting_wait):
        doc = json.loads(waiter.stdout)
        assert doc["role"] == "waited" and doc["waited_on"] == "holder-1" and doc["producer"] == "holder-1"
        assert doc["token"] == computed["token"] and doc["value"] == "features: 1234 rows\n"
        assert doc["waited_seconds"] > 0
        events = [json.loads(line) for line in waiter.lines]  # with --json, stderr is JSON lines too
        assert events[0]["event"] == "waiting" and events[-1]["event"] == "done"

    for later in (
        dibs("run", "--json", "--key", "day", "--", "false", store=store),
        dibs("wait", "day", "--json", store=store),
    ):
        assert envelope(later) | {"producer": "x"} == computed | {"role": "hit", "producer": "x"}


def test_envelopes_carry_binary_output_as_base64_and_other_artifacts_as_json(store: str) -> None:
    every_byte = "import sys; sys.stdout.buffer.write(bytes(range(256)))"
    doc = envelope(dibs("run", "--json", "--key", "bin", "--", sys.executable, "-c", every_byte, store=store))
    assert doc["encoding"] == "base64" and base64.b64decode(doc["value"]) == bytes(range(256))
    raw = subprocess.run(
        [*DIBS, "wait", "bin", "--store", store], capture_output=True, check=True, timeout=120
    )
    assert raw.stdout == bytes(range(256))

    lib.Reservations(store).run("from-python", lambda: {"rows": 3, "ok": True})
    doc = envelope(dibs("wait", "from-python", "--json", store=store))
    assert doc["encoding"] == "json" and doc["value"] == {"rows": 3, "ok": True} and doc["role"] == "hit"
    assert json.loads(dibs("wait", "from-python", store=store).stdout) == {"rows": 3, "ok": True}


# -- options, help, messages ----------------------------------------------------------------------------


def test_global_options_work_before_or_after_the_command(store: str) -> None:
    first = run_dibs(
        "--store", store, "--namespace", "team.a", "--json", "run", "--key", "k", "--", "echo", "hi"
    )
    assert envelope(first)["key"] == "team.a/k" and envelope(first)["role"] == "computed"
    again = run_dibs("run", "--key", "k", "--json", "-n", "team.a", "--store", store, "--", "echo", "other")
    assert envelope(again)["role"] == "hit" and envelope(again)["value"] == "hi\n"

    before = run_dibs("--json", "--store", store, "-n", "team.a", "ls").stdout
    after = run_dibs("ls", "--json", "--store", store, "--namespace", "team.a").stdout
    mixed = run_dibs("--json", "ls", "--namespace", "team.a", "--store", store).stdout
    rows = [[{**row, "detail": None} for row in json.loads(out)] for out in (before, after, mixed)]
    assert rows[0] == rows[1] == rows[2]  # the same listing, but for its "done 1.2s ago" detail
    assert [row["key"] for row in rows[0]] == ["k"]
    assert json.loads(run_dibs("ls", "--json", "--store", store).stdout) == []  # other namespace

    verbose = run_dibs("-v", "--store", store, "run", "--key", "v", "--", "echo", "x")
    assert "default/v: computing it" in verbose.stderr


def test_version() -> None:
    assert run_dibs("--version").stdout == f"dibs {lib.__version__}\n"


EXIT_STATUSES = {
    "run": {"0", "N", "2", "65", "69", "75", "127", "130"},
    "wait": {"0", "2", "65", "69", "75", "130"},
    "ls": {"0", "2", "65", "69", "130"},
    "show": {"0", "1", "2", "65", "69", "130"},
    "release": {"0", "1", "2", "65", "69", "130"},
    "forget": {"0", "1", "2", "65", "69", "130"},
    "reap": {"0", "2", "65", "69", "130"},
    "prune": {"0", "2", "65", "69", "130"},
    "top": {"0", "2", "65", "69", "130"},
}


@pytest.mark.parametrize("command", sorted(EXIT_STATUSES))
def test_every_help_describes_its_command_and_lists_its_exit_statuses(command: str) -> None:
    text = run_dibs(command, "--help").stdout
    description = text.split("\n\n")[1]
    assert len(description.split()) >= 10, text  # a description, not only the usage line
    statuses = text.split("exit status:\n", 1)[1].split("\n\n")[0]
    codes = {line.split()[0] for line in statuses.splitlines()}
    assert codes == EXIT_STATUSES[command], statuses
    assert "143" in statuses and "before or after the command" in text

    overview = run_dibs("--help").stdout
    assert re.search(rf"^\s+{command}\s+\w", overview, re.M)  # listed with its summary


def test_timeouts_use_one_wording_naming_the_holder_or_the_last_failure(store: str) -> None:
    client = lib.Reservations(store)
    client.get_or_reserve("busy", owner="etl-nightly")
    for args in (
        ("run", "--key", "busy", "--timeout", "0.2", "--", "echo", "x"),
        ("wait", "busy", "--timeout", "0.2"),
    ):
        result = dibs(*args, store=store, check=False)
        assert result.returncode == 75
        assert re.fullmatch(
            r"dibs: error: gave up waiting for default/busy after \d+\.\ds: still held by 'etl-nightly' "
            r"\(lease attempt 1 on this key; its lease runs \d+\.\ds more unless renewed\)\n",
            result.stderr,
        ), result.stderr

    dibs("run", "--key", "broken", "--", "sh", "-c", "echo boom >&2; exit 3", store=store, check=False)
    result = dibs("wait", "broken", "--timeout", "0.2", store=store, check=False)
    assert result.returncode == 75 and result.stderr.count("\n") == 1
    assert "not computed: its last attempt failed" in result.stderr
    assert "command \"sh -c 'echo boom >&2; exit 3'\" exited with status 3" in result.stderr
    shown = dibs("show", "busy", store=store).stdout
    assert "holder" in shown and "etl-nightly" in shown
    for text in (result.stderr, shown, dibs("ls", store=store).stdout):
        assert not RAW_EPOCH.search(text), text


def test_bad_input_is_reported_in_one_line(store: str) -> None:
    result = dibs("ls", store="nope://x", check=False)
    assert result.returncode == 2 and "unknown store scheme 'nope'" in result.stderr
    assert "Traceback" not in result.stderr
    result = dibs("run", "--key", "k", store=store, check=False)
    assert result.returncode == 2 and "give the command after '--'" in result.stderr
    result = dibs("show", "bad\nkey", store=store, check=False)
    assert result.returncode == 2 and "non-printable" in result.stderr
    result = dibs("run", "--key", "k", "--timeout", "-1", "--", "true", store=store, check=False)
    assert (
        result.returncode == 2 and "--timeout: expected a number of seconds >= 0, got '-1'" in result.stderr
    )


@pytest.mark.parametrize(
    "url",
    ["postgresql+psycopg://postgres@127.0.0.1:1/test", "redis://127.0.0.1:1/0"],
    ids=["postgres", "redis"],
)
def test_an_unreachable_store_is_one_error_and_status_69(url: str) -> None:
    for args in (("ls",), ("wait", "k", "--timeout", "1"), ("run", "--key", "k", "--", "echo", "x")):
        result = dibs(*args, store=url, check=False)
        assert result.returncode == 69, result.stderr
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("dibs: error: "), result.stderr
        assert result.stdout == ""


# -- inspection and repair --------------------------------------------------------------------------------


def test_ls_show_release_forget_reap(store: str) -> None:
    dibs("run", "--key", "done-key", "--", "echo", "hi", store=store)
    lib.Reservations(store, ttl=600).get_or_reserve("held-key", owner="crashed-worker")
    listing = json.loads(dibs("ls", "--json", store=store).stdout)
    assert {row["key"]: (row["status"], row["holder"]) for row in listing} == {
        "done-key": ("done", None),
        "held-key": ("held", "crashed-worker"),
    }

    table = dibs("ls", store=store).stdout
    assert table.splitlines()[0].split() == ["NAMESPACE", "KEY", "STATUS", "HOLDER", "TOKEN", "DETAIL"]
    assert "done-key" in table

    assert dibs("forget", "done-key", store=store).stdout.strip() == "done-key: forgotten"
    assert dibs("forget", "done-key", store=store, check=False).returncode == 1
    assert (
        dibs("release", "done-key", store=store, check=False).stdout.strip()
        == "done-key: no lease to release"
    )
    assert dibs("release", "held-key", store=store).stdout.strip() == "held-key: released"
    assert json.loads(dibs("show", "held-key", "--json", store=store).stdout)["status"] == "free"
    # Forgotten and released, both records hold nothing: reap clears them to tombstones, and ls has
    # nothing to list; a tombstone keeps the key's fence, so the next holder's token is higher.
    assert json.loads(dibs("reap", "--json", store=store).stdout) == {"reaped": 2}
    assert json.loads(dibs("reap", "--json", store=store).stdout) == {"reaped": 0}
    assert json.loads(dibs("ls", "--json", store=store).stdout) == []
    shown = json.loads(dibs("show", "held-key", "--json", store=store).stdout)
    assert (shown["status"], shown["fence"], shown["attempts"]) == ("free", 1, 0)
    again = lib.Reservations(store, ttl=600).get_or_reserve("held-key", owner="next-worker")
    assert isinstance(again, lib.Acquired) and again.lease.token == 2
    again.lease.release()


def test_ls_show_and_top_tell_each_artifacts_compute_time(store: str) -> None:
    client = lib.Reservations(store, ttl=600)
    got = client.get_or_reserve("slow-key", owner="builder")
    assert isinstance(got, lib.Acquired)
    got.lease.complete("built", compute_seconds=75.0)  # as the work under its lease reported it
    client.get_or_reserve("held-key", owner="crashed-worker")
    failing = client.get_or_reserve("bad-key", owner="flaky")
    assert isinstance(failing, lib.Acquired)
    failing.lease.release("ValueError: no rows")

    (row,) = [r for r in json.loads(dibs("ls", "--json", store=store).stdout) if r["key"] == "slow-key"]
    assert row["compute_seconds"] == 75.0 and "by builder in 1m 15s, " in row["detail"]
    assert " in 1m 15s, " in dibs("ls", store=store).stdout
    assert (
        json.loads(dibs("show", "slow-key", "--json", store=store).stdout)["artifact_compute_seconds"] == 75.0
    )

    doc = json.loads(dibs("top", "--json", store=store).stdout)
    assert doc["counts"] == {"held": 1, "expired": 0, "done": 1, "failed": 1}
    (held,) = doc["held"]
    assert (held["key"], held["holder"], held["token"]) == ("default/held-key", "crashed-worker", 1)
    assert 0 < held["expires_in_s"] <= 600
    (latest,) = doc["recent_artifacts"]
    assert (latest["key"], latest["producer"], latest["compute_seconds"]) == (
        "default/slow-key",
        "builder",
        75.0,
    )
    (failure,) = doc["recent_failures"]
    assert (failure["key"], failure["owner"], failure["error"]) == (
        "default/bad-key",
        "flaky",
        "ValueError: no rows",
    )
    screen = dibs("top", store=store).stdout  # not a terminal: printed once
    assert (
        screen.startswith("dibs top: default on sqlite:") and "held 1  expired 0  done 1  failed 1" in screen
    )
    for section in ("HELD", "LATEST ARTIFACTS", "LATEST FAILURES"):
        assert f"\n{section}\n" in screen
    assert "1m 15s" in screen and "crashed-worker" in screen and "ValueError: no rows" in screen


def test_readable_names_select_keys_and_name_one_key_or_list_the_candidates(store: str) -> None:
    names = ["load@1/aaaa1111", "load@2/bbbb2222", "load@2/bbbb3333", "loader/cccc4444"]
    for name in names:
        dibs("run", "--key", name, "--", "echo", name, store=store)

    def listed(*pattern: str) -> list[str]:
        return [row["key"] for row in json.loads(dibs("ls", *pattern, "--json", store=store).stdout)]

    assert listed("load") == names[:3]  # every version of load, not loader
    assert listed("load@2") == names[1:3]
    assert listed("load@2/bbbb3") == [names[2]]
    assert listed("load*") == names
    assert listed("nothing-like-it") == []

    ambiguous = dibs("forget", "load@2", store=store, check=False)
    assert ambiguous.returncode == 2, ambiguous.stderr
    assert "'load@2' names 2 keys in namespace 'default'" in ambiguous.stderr
    assert "load@2/bbbb2222, load@2/bbbb3333" in ambiguous.stderr
    assert listed() == names  # nothing was forgotten

    assert dibs("forget", "load@2/bbbb3", store=store).stdout == "load@2/bbbb3333: forgotten\n"
    assert (
        json.loads(dibs("show", "loader", "--json", store=store).stdout)["key"] == "default/loader/cccc4444"
    )
    assert listed() == [names[0], names[1], names[3]]


def test_prune_removes_old_artifacts_and_failures_never_a_held_key(store: str) -> None:
    dibs("run", "--key", "done", "--", "echo", "x", store=store)
    dibs("run", "--key", "failed", "--", "false", store=store, check=False)
    lib.Reservations(store, ttl=600).get_or_reserve("held", owner="worker-1")

    assert dibs("prune", "--older-than", "1h", store=store).stdout == "pruned 0 record(s) older than 1h 00m\n"
    dry = json.loads(dibs("prune", "--older-than", "0", "--dry-run", "--json", store=store).stdout)
    assert dry == {"would_prune": ["default/done", "default/failed"]}
    assert len(json.loads(dibs("ls", "--json", store=store).stdout)) == 3  # a dry run removes nothing

    assert json.loads(dibs("prune", "--older-than", "0s", "--json", store=store).stdout) == {"pruned": 2}
    assert [row["key"] for row in json.loads(dibs("ls", "--json", store=store).stdout)] == ["held"]

    bad = dibs("prune", "--older-than", "3 fortnights", store=store, check=False)
    assert bad.returncode == 2 and "expected a duration such as 90 (seconds)" in bad.stderr, bad.stderr
    assert "'3 fortnights'" in bad.stderr


def test_run_refresh_and_max_age_compute_again_and_replace_the_stored_output(
    store: str, tmp_path: Path
) -> None:
    assert dibs("run", "--key", "k", "--", "echo", "one", store=store).stdout == "one\n"
    assert dibs("run", "--key", "k", "--max-age", "1h", "--", "echo", "two", store=store).stdout == "one\n"
    zero = dibs("run", "--key", "k", "--max-age", "0", "--", "echo", "two", store=store, check=False)
    assert zero.returncode == 2 and "--max-age: expected a duration greater than 0, got '0'" in zero.stderr
    # until the store's clock says the artifact is older than a second (no sleep of a guessed length)
    eventually(lambda: _age(store, "k") > 1.0, "the artifact to be older than a second")
    assert dibs("run", "--key", "k", "--max-age", "1s", "--", "echo", "two", store=store).stdout == "two\n"
    assert dibs("run", "--key", "k", "--refresh", "--", "echo", "three", store=store).stdout == "three\n"
    assert dibs("run", "--key", "k", "--", "echo", "four", store=store).stdout == "three\n"

    # Concurrent refreshes compute once, and every one of them prints the new output. The one that
    # computes holds on until the three others wait on it (a refresh that starts after another one
    # ended computes again, as it should), however long each took to start.
    log, gate = tmp_path / "refreshes.log", tmp_path / "gate"
    script = (
        f"import pathlib, time\npathlib.Path({str(log)!r}).open('a').write('ran\\n')\n"
        f"while not pathlib.Path({str(gate)!r}).exists(): time.sleep(0.02)\nprint('five')"
    )
    command = ["-v", "run", "--store", store, "--key", "k", "--refresh", "--", sys.executable, "-c", script]
    with contextlib.ExitStack() as stack:
        runs = [stack.enter_context(running(*command)) for _ in range(4)]
        eventually(lambda: sum(run.said("is computing it") for run in runs) == 3, "three refreshes to wait")
        gate.touch()
        statuses = [run.finish() for run in runs]
    assert statuses == [0] * 4, [run.stderr for run in runs]
    assert log.read_text() == "ran\n"
    assert [run.stdout for run in runs] == [b"five\n"] * 4


def test_ls_wraps_details_at_word_boundaries_and_leaves_forgotten_keys_out(store: str) -> None:
    client = lib.Reservations(store)
    error = (
        "ValueError: the upstream extract for 2026-11-25 had 1234 rows where at least 5000 were expected, "
        "so the features were not written; rerun after the extract is complete"
    )
    got = client.get_or_reserve("features-2026-11-25", owner="etl-nightly")
    assert isinstance(got, lib.Acquired)
    got.lease.release(error)
    dibs("run", "--key", "gone", "--", "echo", "x", store=store)
    dibs("forget", "gone", store=store)

    status, _, drawn = on_terminal("ls", "--store", store, columns=80, stdout_too=True)
    assert status == 0
    lines = drawn.replace("\r\n", "\n").rstrip("\n").split("\n")
    assert all(len(line) <= 80 for line in lines), lines
    assert len(lines) > 2  # the detail did not fit on one line: it was wrapped
    assert error in " ".join(" ".join(lines).split())  # ...whole: every word intact, in order
    assert not any(" gone " in line for line in lines)
    assert [row["key"] for row in json.loads(dibs("ls", "--json", store=store).stdout)] == [
        "features-2026-11-25"
    ]
    assert json.loads(dibs("show", "gone", "--json", store=store).stdout)["status"] == "free"


def test_bare_mysql_and_mariadb_urls_use_the_driver_of_the_mysql_extra(tmp_path: Path) -> None:
    from tests.backends import mysql

    with mysql.isolated_url(tmp_path) as url:
        bare = re.sub(r"^mysql\+pymysql://", "mysql://", url)
        assert bare.startswith("mysql://"), url
        assert dibs("run", "--key", "k", "--", "echo", "hi", store=bare).stdout == "hi\n"
        mariadb = bare.replace("mysql://", "mariadb://", 1)
        assert dibs("wait", "k", store=mariadb).stdout == "hi\n"


@pytest.mark.parametrize("backend", ["postgres", "redis"])
def test_a_store_that_goes_down_under_a_run_is_reported_once(backend: str, tmp_path: Path) -> None:
    from reliability.faults import FaultProxy

    started, go = tmp_path / "started", tmp_path / "go"
    script = "\n".join(
        [
            "import pathlib, sys, time",
            "pathlib.Path(sys.argv[1]).touch()",
            "while not pathlib.Path(sys.argv[2]).exists(): time.sleep(0.02)",
            "print('done')",
        ]
    )
    with importlib.import_module(f"tests.backends.{backend}").isolated_url(tmp_path) as url:
        server = urlsplit(url)
        assert server.hostname is not None and server.port is not None
        with FaultProxy(server.hostname, server.port) as proxy:
            proxied = url.replace(f"{server.hostname}:{server.port}", f"127.0.0.1:{proxy.port}", 1)
            args = ("run", "--store", proxied, "--ttl", "1", "--key", "k", "--")
            with running(*args, sys.executable, "-c", script, str(started), str(go)) as run:
                eventually(started.exists, "the command to start")
                proxy.refuse(True)
                proxy.cut_all()
                run.wait_for_line("lost the lease")
                go.touch()
                status = run.finish()

    assert status == 69, run.stderr
    assert run.stdout == b"done\n"
    said = [
        line.split(": ", 2)[2] for line in run.lines if line.startswith(("dibs: error: ", "dibs: warning: "))
    ]
    assert said and said == [line.split(": ", 2)[2] for line in run.lines], run.lines  # only dibs spoke
    for i, message in enumerate(said):  # nothing said twice, not even inside a longer message
        assert not any(message in other for other in said[:i] + said[i + 1 :]), run.lines


def _age(store: str, key: str) -> float:
    """How old ``key``'s artifact is, by the store's clock."""
    with lib.Reservations(store) as client:
        state = client.status(key)
    assert state.artifact is not None
    return state.now - state.artifact.created_at
