"""``RELIABILITY.md``: what the full run did to each store, and what it found.

The numbers are generated; the list of findings fixed in the core (:data:`FIXED`) is kept here by
hand, because it is history: the run that found a violation is, by definition, not the run that
shows zero.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import sys
from collections import Counter, defaultdict
from typing import Any

from reliability.scenarios import SKEW_SECONDS, SPIN_ASKS_PER_SECOND, ScenarioResult, Sizes

__all__ = ["FIXED", "HARDENED", "one_line", "render"]

_T = "tests/test_fault_regressions.py::"
_H = "tests/test_hardening.py::"

#: Violations this suite found in the core, how they were fixed, and the regression test of each.
FIXED: list[tuple[str, str, str]] = [
    (
        "Store faults (reply reset after the store acted; PostgreSQL, MySQL, Redis): a `complete` that had "
        'stored the artifact reported `StoreUnavailable`; under `on_store_unavailable="run"` '
        "`Reservations.compute` raised it, and the work ran again once the lease expired.",
        "`Lease.complete` settles an unknown outcome by reading the key again for up to one ttl (its own "
        "artifact: stored; the lease still its own: sent again, fenced; anything else: `LeaseLost`). "
        "`compute` applies the policy if the store stays unreachable (`run`: returns the value with "
        "`stored=False`; `fail`: raises), and logs either way.",
        f"{_T}test_a_complete_whose_reply_was_lost_is_recognised_as_stored, "
        f"{_T}test_a_complete_that_never_reached_the_store_is_sent_again, "
        f"{_T}test_a_complete_that_cannot_be_settled_follows_the_unavailable_policy",
    ),
    (
        "Store down: policy `fail` raised `StoreUnavailable` without logging it.",
        "`compute` logs the decision (error) before raising, as it already did (warning) for `run`.",
        f"{_T}test_policy_fail_is_logged_when_the_store_is_unavailable",
    ),
    (
        "Store down as a client starts: opening a SQL store contacts the database, so "
        '`Reservations(url, on_store_unavailable="run")` raised and the policy never applied.',
        "Under policy `run` the client opens the store on first use instead (each call retries, and the "
        "policy decides per call); policy `fail` still raises at once.",
        f"{_T}test_policy_run_is_kept_when_the_store_is_down_as_the_client_starts",
    ),
    (
        "Connection cut while PostgreSQL tables are created: the advisory unlock in a `finally` ran on the "
        "dropped connection and SQLAlchemy's `PendingRollbackError` escaped instead of `StoreUnavailable`.",
        "The unlock is skipped on an invalidated connection (the lock died with the session).",
        f"{_T}test_a_connection_dropped_while_creating_the_postgres_schema_is_store_unavailable",
    ),
    (
        "Foreign SQL row (another key's namespace/name at this key's hash): reads refused it, but the "
        "holder's `complete` wrote its artifact into it.",
        "The token-checked UPDATEs also require the row's namespace and name (and an owner).",
        f"{_T}test_a_holder_cannot_complete_into_a_row_that_claims_another_key",
    ),
    (
        'SQL row with a NULL lease owner was read as a lease owned by `"None"` (waiters waited on a '
        "phantom), and the holder's `complete` turned it into an artifact without a producer.",
        "Required text columns are checked (`CorruptRecord`, row untouched).",
        f"{_T}test_a_lease_row_without_owner_is_corrupt_not_owned_by_none",
    ),
    (
        "Record documents (file and Azure stores) with fields of the wrong type were coerced "
        "(`str(None)`, `str(12345)`, `int(1.5)`) into plausible leases, acted on and rewritten.",
        "`dibs.stores.codec.decode` checks every field's type; a wrong one makes the record corrupt.",
        f"{_T}test_a_record_document_with_a_field_of_the_wrong_type_is_corrupt",
    ),
    (
        "A refused pickle signature did not name the key; a custom serializer's own exception escaped as is.",
        "`Reservations.decode` adds the key to serializer errors and wraps foreign exceptions in "
        "`SerializationError`.",
        f"{_T}test_a_refused_pickle_signature_names_the_key, "
        f"{_T}test_a_serializer_that_fails_with_its_own_error_gives_a_serialization_error_naming_the_key",
    ),
    (
        "PostgreSQL watch whose listening connection broke (connections cut while waiting): every later "
        "wait returned at once, so the waiter asked the database again and again without backoff.",
        "The process's watch hub notices, lets waiters poll meanwhile, listens again on a new connection "
        "and reads every watched key once more.",
        f"{_T}test_the_hub_listens_again_after_its_connection_is_cut",
    ),
    (
        "Full-size contention on PostgreSQL: with the server out of connection slots (`too many "
        "clients`), opening a waiter's listening connection raised `StoreUnavailable` and failed the "
        "call, although the store itself still answered.",
        "The watch hub says it is not following (logged) and waiters poll until it can listen again.",
        f"{_T}test_a_waiter_polls_when_no_listening_connection_can_be_opened",
    ),
    (
        "Full-size SIGKILL trials on PostgreSQL: every waiting thread held a listening connection of its "
        "own (plus up to four idle ones per process), so two processes waiting on ten keys each ran the "
        "server out of connections and waiters failed with `StoreUnavailable` (`too many clients`).",
        "One store, pool and watch hub per process (`dibs.runtime`): at most four connections to the "
        "server however many waiters (500 triggers, 200 threads, counted in `pg_stat_activity`).",
        "tests/airflow/test_trigger_scale.py, tests/test_waiting_scale.py",
    ),
    (
        "SQL URL with a query option the driver rejects (fuzzed URLs): psycopg's `ProgrammingError` and "
        "PyMySQL's `TypeError` escaped.",
        "`ConfigurationError` naming the option (not chained, never the password).",
        f"{_T}test_an_option_the_sql_driver_rejects_is_a_configuration_error",
    ),
    (
        "SQL URL with a non-numeric port: SQLAlchemy's `ValueError` escaped (not a `ReservationError`).",
        "`ConfigurationError` naming the port, not chained (SQLAlchemy's messages quote the password).",
        f"{_T}test_a_bad_port_in_a_sql_url_is_a_configuration_error_naming_it",
    ),
    (
        "`redact_url` left a password inside a URL in the query (`account_url=https://user:pw@host`), "
        "which an Azure configuration error then showed.",
        "Userinfo inside query values is redacted too.",
        f"{_T}test_a_password_inside_a_url_in_the_query_is_redacted",
    ),
    (
        "Credentials (new cases for issue 12): a `file://user:pw@localhost/...` URL whose password holds a "
        "`/` quoted the password's tail as a directory, and an Azure `account_url` with such a password "
        "was accepted and shown in `store.url` and `repr(client)`.",
        "File store URLs with a user part are refused; an `account_url` with any `@` is refused.",
        f"{_H}test_file_and_azure_urls_with_a_password_are_refused_without_showing_it",
    ),
]

_R = "tests/test_removal_races.py::"
_C = "tests/contract/test_store_contract.py::TestStoreContract::"

#: What the removal scenario found in the code before issue 16's fix (the store-side fix and its
#: regression tests came from the removal work; this suite reproduced both defects on every store
#: before it, and shows zero since).
FOUND_BY_REMOVALS: list[tuple[str, str, str]] = [
    (
        "Removals racing computes, every store (full size, before the fix): `prune`, `reap` and "
        "`discard` deleted a key's record, so the next holder got fence 1 again: hundreds of `fencing` "
        "violations per store (up to 26 leases of one key sharing fence 1; reads saw a key's fence go "
        "from 2 to 1).",
        "Removal leaves a tombstone that keeps the fence (and, on SQL, the row version); listings hide "
        "tombstones.",
        f"{_C}test_tokens_never_rewind_after_removal, {_R}test_two_removers_never_remove_a_live_lease",
    ),
    (
        "MySQL (full size, before the fix): a remover paused between reading a row and its versioned "
        "`DELETE` matched a re-created row at the same version and deleted a live lease: the holder's "
        "`complete` was refused and another process was granted the key 0.67 s into the first lease's "
        "1.5 s ttl (`exclusion (real time)`, key m011).",
        "Row versions never restart (the row is never deleted), so a delayed statement cannot match a "
        "newer row.",
        f"{_R}test_a_paused_sql_remover_cannot_match_a_newer_row, "
        f"{_R}test_a_delayed_prune_statement_cannot_remove_a_new_holders_lease",
    ),
]

#: Defects found by probing dibs with hostile and careless input (issue 12), which this suite did not
#: catch at the time; fixed, pinned by regression tests, and checked by the hostile scenario since.
HARDENED: list[tuple[str, str, str]] = [
    (
        "Credentials printed: `redact_url` stopped at the first `?` or `#` and ignored text without `://`, "
        "so a password holding `?`, `#`, `/` or `@` showed in `dibs ls` errors, `repr(client)`, "
        "`store.url` (policy `run`), the Airflow hook's log line and `test_connection`, and passed the "
        "Prefect block's check; a raw `@` reached the SQL driver as part of the host name, whose "
        '"cannot resolve host" message showed the password\'s tail.',
        "`redact_url` ends the user part at the last `@`; URLs a driver would split inside the password "
        "are refused before connecting; driver messages and `test_connection` hide the URL's secrets.",
        f"{_H}test_redact_url_hides_passwords_with_url_delimiters, "
        f"{_H}test_no_password_in_errors_repr_or_url_of_an_unreachable_postgres, "
        f"{_H}test_a_raw_at_in_a_sql_password_never_reaches_the_driver_as_a_host, "
        f"{_H}test_no_password_in_redis_errors, {_H}test_dibs_ls_never_prints_the_password, "
        f"{_H}test_the_prefect_block_refuses_every_password_in_its_url, "
        f"{_H}test_the_airflow_hook_logs_and_tests_without_the_password",
    ),
    (
        "A ttl above `threading.TIMEOUT_MAX` killed the process-wide heartbeat launcher: every other "
        "client in the process stopped heartbeating.",
        "`dibs.config.validate_seconds` bounds every duration (at most 10 years), with an error naming the "
        "setting; the launcher also caps its own wait.",
        f"{_H}test_every_duration_input_is_bounded_with_an_error_naming_it, "
        f"{_H}test_a_far_away_first_heartbeat_does_not_stop_the_launcher_for_other_clients",
    ),
    (
        "One bad record broke the admin tools: a NULL-owner SQL row, a foreign value under Redis "
        "`<prefix>rec:*`, a directory in place of a file-store record; a FIFO hung every call; a sparse "
        "2 GiB record was read whole.",
        "`Store.list` returns a `Listing`: unreadable records are skipped, logged and counted (`dibs ls` "
        "says how many), on every store; the file store opens only regular files, without blocking, and "
        "reads at most 1 MiB of a record.",
        f"{_H}test_a_bad_record_is_skipped_counted_and_reported_by_list_reap_and_ls, "
        f"{_H}test_a_fifo_in_place_of_a_record_hangs_nothing, "
        f"{_H}test_a_huge_sparse_record_is_not_read_into_memory",
    ),
    (
        "Raw exceptions: a fence of 2^63-1, 2^31-1 attempts, expiries beyond 9999 (`dibs show` printed a "
        "traceback), a 100,000-deep value (`RecursionError`, lease kept), over-long table names, "
        "`busy_timeout=nan`.",
        "One strict record decoder for every store (ranges included); saturating counters; "
        "`SerializationError` for deep values (the lease is released); table and schema name limits.",
        f"{_H}test_the_largest_fence_is_refused_with_a_dibs_error_naming_it, "
        f"{_H}test_counters_at_their_largest_stay_there, "
        f"{_H}test_an_expiry_beyond_the_year_9999_is_a_dibs_error_and_show_prints_no_traceback, "
        f"{_H}test_a_100000_deep_value_is_a_serialization_error_and_frees_the_key, "
        f"{_H}test_an_over_long_table_name_is_refused_before_the_database_sees_it, "
        f"{_H}test_a_bad_busy_timeout_is_a_configuration_error",
    ),
    (
        "dibs damaged records itself: Redis fences above 2^53 (Lua doubles) stopped increasing and were "
        "written as `1e+17`; a non-string owner made a file-store record unreadable; under a latin1 "
        "MariaDB database keys were stored as `??`; holder names and errors were printed raw.",
        "Exact integer fences in Lua (HINCRBY, decimal strings); `validate_owner` in every store's "
        "acquire; utf8mb4 tables; `dibs.display.printable` in `ls`, `show`, errors and CLI logs.",
        f"{_H}test_fences_above_2_to_the_53_stay_exact, "
        f"{_H}test_an_owner_dibs_cannot_store_is_refused_before_anything_is_written, "
        f"{_H}test_a_latin1_mariadb_database_keeps_every_key_and_owner_exact, "
        f"{_H}test_ls_and_show_never_print_raw_escape_sequences",
    ),
    (
        "MariaDB values over `max_allowed_packet` were reported as `StoreUnavailable`, re-sent for a whole "
        "ttl, and the lease was not released.",
        "`ArtifactTooLarge` (a `SerializationError`) naming the size and the limit, before sending; the "
        "client releases the lease.",
        f"{_H}test_a_value_over_max_allowed_packet_is_a_size_error_and_the_lease_is_released",
    ),
    (
        "PostgreSQL stale pooled connections: after the server ended them, each failed one later call.",
        "On a disconnect the pool is dropped and reads, acquire and heartbeat run once more on a fresh "
        "connection; complete and release are never repeated blindly.",
        f"{_H}test_reads_recover_from_connections_the_server_ended, "
        f"{_H}test_a_write_whose_connection_was_ended_is_not_sent_again_blindly",
    ),
    (
        "The pickle HMAC did not bind the key: a signed artifact copied from another key was accepted.",
        "The signature covers the key's digest and the fence; what the checksum and the signature "
        "protect is documented in `dibs.serializers` and `docs/contract.md`.",
        f"{_H}test_a_signed_artifact_copied_to_another_key_or_fence_is_refused",
    ),
    (
        "Issue 16 (measured on main): values over Redis's 512 MB or SQLite's blob limit were re-sent "
        "for a ttl (Redis) or raised a raw `DataError` and left the key held (SQLite); a silent network "
        "before `complete` blocked PostgreSQL for 45 s and longer; 30 waiting PostgreSQL processes held "
        "98 connections and 17 of 90 calls failed with `too many clients`; under a concurrent prune "
        "MariaDB holders were told their stored artifact was not stored, and a deadlock (1213) reached "
        "a caller.",
        "Every store knows its size limit and refuses before sending (`ArtifactTooLarge`, lease "
        "released, value returned); PostgreSQL/MySQL calls bounded by `?timeout=` on the client and the "
        "server; the SQL pool waits 0.25 s before opening another connection and closes idle ones "
        'beyond one (two per waiting process, measured); "too many clients" names `pool_size` and '
        "PgBouncer in session mode; deadlocks and lock wait timeouts retried; MariaDB's `complete` "
        "reads what it wrote from session variables.",
        "`tests/test_limits.py` (every test)",
    ),
    (
        "Issue 16: a cancelled `aio().acquire` could leave the key held by nobody for the ttl (the "
        "store call finished in the executor after the cancel); a cancelled re-entry must not free its "
        "owner's lease.",
        "The ask is a future of dibs's own; on cancellation a callback releases the lease that ask "
        "made, in the executor, whatever the loop does.",
        "`tests/test_cancellation.py` (every store: cancelled during and after the store call, at "
        "random small delays, and a re-entry)",
    ),
    (
        "Issue 16: `ttl=1e-9` was accepted (heartbeats at 2,609 writes/s on SQLite, and a rival still "
        "took the key).",
        "`validate_timings` refuses a ttl below 0.15 s and a heartbeat interval below 50 ms, at every "
        "entry point.",
        "`tests/test_hardening.py::test_a_ttl_or_heartbeat_interval_below_the_floor_is_refused_everywhere`<br>`tests/test_hardening.py::test_dibs_run_refuses_a_ttl_below_the_floor_in_one_line`",
    ),
    (
        "Issue 16: a Redis `?password=` holding `@` or `&` leaked its tail; `sqlite://u:PASSWORD@/` was "
        "echoed whole; a PostgreSQL row version of 2^63-1 made `dibs release` print a `DataError`; "
        "`?table=pg_class` raised a raw `ProgrammingError`; SQLite `table=Abc` and `table=abc` were one "
        "table.",
        "`redact_url` hides the widest span a secret may cover and is the one way a URL is shown "
        "(fuzzed with hypothesis); the SQL store guards its row version (`CorruptRecord`) and refuses "
        "reserved, foreign and (on SQLite) upper-case table names.",
        "`tests/unit/test_redaction.py`<br>`tests/test_hardening.py::test_no_password_in_any_cli_line_repr_or_url_whatever_the_url_form`<br>`tests/test_hardening.py::test_a_row_version_at_the_largest_bigint_is_a_corrupt_record_not_a_traceback`<br>`tests/test_hardening.py::test_a_table_that_is_not_a_dibs_table_is_refused_naming_it`<br>`tests/test_hardening.py::test_sqlite_table_names_differing_only_by_case_are_refused`",
    ),
    (
        "Issue 16: stops (Ctrl-C, `SystemExit`, cancellation, `on_kill`) counted towards "
        "`max_failures`; NFC and NFD spellings of a key name were two keys; a `setsid` child of a "
        "SIGKILLed `dibs run` outlived it.",
        "Stops are recorded but not counted (`Store.release(counted=False)`); key names are "
        "NFC-normalized; the guard also stops, on Linux, descendants that left the process group.",
        "`tests/contract/test_store_contract.py::TestStoreContract::test_a_stop_is_recorded_but_not_counted_as_a_failure`<br>`tests/unit/test_runtime.py::test_a_stop_never_counts_towards_max_failures`<br>`tests/unit/test_keys.py::test_names_that_differ_only_by_unicode_normalization_are_one_key`<br>`tests/test_cli_stops.py::test_a_killed_dibs_run_takes_a_child_that_left_the_group_with_it`",
    ),
]

#: Violations found in stores maintained separately (reported to their maintainers, fixed by them).
REPORTED: list[tuple[str, str]] = [
    (
        "azure",
        "`azure://user:PASSWORD@host/` (credentials written where the container belongs) gave a "
        "`ConfigurationError` that quoted the netloc, password included, as an invalid container "
        "name (found by the fuzzed URLs). Fixed by the Azure store's maintainers: such URLs are now "
        "refused without echoing the credentials; the hostile-input scenario keeps checking it.",
    ),
]

_SCENARIO_TITLES = {
    "contention": "1. contention",
    "kill": "2. SIGKILL holder",
    "pause": "3. SIGSTOP holder",
    "faults": "4. store faults",
    "skew": "5. clock skew +-10 min",
    "hostile": "6. hostile input",
    "removal": "7. removals racing",
    "payloads": "8. payload collection racing",
}


def one_line(result: ScenarioResult) -> str:
    """A progress line for the terminal."""
    if result.skipped:
        return f"{result.store:<8} {result.scenario:<10} skipped: {result.skipped}"
    faults = sum(result.faults.values())
    expected = f" (+{len(result.expected)} expected)" if result.expected else ""
    return (
        f"{result.store:<8} {result.scenario:<10} {result.trials:>6} {result.trial_unit.split(' (')[0]:<32} "
        f"{faults:>5} faults  {len(result.unexpected)} violations{expected}  {result.seconds:5.0f}s"
    )


def _faults(result: ScenarioResult) -> str:
    if not result.faults:
        return "none"
    return ", ".join(f"{count} {name}" for name, count in sorted(result.faults.items()) if count)


def _latency(figures: dict[str, Any]) -> tuple[str, ...]:
    lat = figures.get("takeover_seconds") or {}
    if not lat:
        return ("-",) * 5
    return (
        str(lat["n"]),
        f"{lat['min']:.2f}",
        f"{lat['median']:.2f}",
        f"{lat['p95']:.2f}",
        f"{lat['max']:.2f}",
    )


def render(
    results: list[ScenarioResult],
    unavailable: dict[str, str],
    *,
    sizes: Sizes,
    full: bool,
    seed: int,
    seconds: float,
) -> str:
    by_store: dict[str, dict[str, ScenarioResult]] = defaultdict(dict)
    for result in results:
        by_store[result.store][result.scenario] = result
    total_unexpected = sum(len(r.unexpected) for r in results)
    total_expected = sum(len(r.expected) for r in results)
    total_trials = sum(r.trials for r in results)
    total_faults = sum(sum(r.faults.values()) for r in results)
    lines: list[str] = []
    add = lines.append
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    add("# Reliability")
    add("")
    add(
        "How dibs behaves when things go wrong, measured: real processes race on every store while faults "
        "are injected, every store operation is recorded, and the recorded history is checked against the "
        "safety invariants of [the reservation contract](docs/contract.md). The method follows the "
        "etcd robustness tests and Jepsen's lock analyses: inject failures, record what every client "
        "saw, check the history against a model, and report what breaks, including what is *expected* "
        "to break."
    )
    add("")
    add(
        f"*Generated by `reliability/run` ({'full size' if full else 'reduced (--ci) size'}) on {when}, "
        f"seed {seed}, {os.cpu_count()} CPU cores, Python {platform.python_version()} on {sys.platform}; "
        f"{seconds / 60:.1f} minutes.* Rerun it with `reliability/run`; `reliability/run --ci` is the "
        "reduced version that `tests/test_reliability.py` runs under pytest."
    )
    add("")
    add(
        f"**{total_trials} trials, {total_faults} injected faults, {total_unexpected} violations** "
        f"({total_expected} expected violations: documented limits, shown below, not hidden)."
    )
    add("")
    _checked_section(add)
    _results_section(add, by_store, unavailable, sizes)
    _takeover_section(add, by_store)
    _pause_section(add, by_store)
    _faults_section(add, by_store)
    _skew_section(add, by_store)
    _hostile_section(add, by_store)
    _removal_section(add, by_store)
    _payload_section(add, by_store)
    _violations_section(add, results)
    _limits_section(add)
    return "\n".join(lines)


def _checked_section(add: Any) -> None:
    add("## What is checked")
    add("")
    add("Over the merged history of every process (`reliability/history.py`):")
    add("")
    add(
        "- **Exclusion, on the store's clock**: the intervals `[acquired_at, expires_at)` that the store "
        "reported for granted or heartbeated leases with different tokens never overlap (a lease ends "
        "early only when its holder completed or released it before the next grant)."
    )
    add(
        "- **Exclusion, in real time** (no clock but the machine's monotonic one): when the store "
        "extended lease A inside `[t0, t1]` and granted lease B after that call returned, B's grant may "
        "not return sooner than A's ttl after A's extension was sent. This catches clients that judge "
        "expiry by a wrong clock even when each of them reports consistent timestamps."
    )
    add(
        "- **Fencing**: tokens strictly increase between grants; no heartbeat, complete or release is "
        "accepted with a token that a newer grant or a stored artifact made stale."
    )
    add(
        "- **Fences only go up, removals included**: a key's fence as any read reports it (a removed "
        "record's too) is never below a fence granted or read before that read began; no two leases of "
        "a key share a fence."
    )
    add(
        "- **One artifact per key**: where nothing removes artifacts, every observation of a key's "
        "artifact (hits, reads, the final read) names the same one; the first completion wins and is "
        "never replaced."
    )
    add(
        "- **No stored artifact lost or corrupted** (with removals): an artifact may disappear only "
        "through a `forget` of its key or a `prune` of its namespace. Precisely, *lost* is any of: (1) "
        "once an artifact was certainly stored (an observation of it returned: the holder's accepted "
        "`complete`, a hit, a read), a later observation shows another artifact or none, and no "
        "`forget`/`prune` call ended after the artifact could have been stored and began before that "
        "observation returned; (2) an artifact seen gone is seen again later (it came back); (3) a "
        "caller was told its value was stored (`stored=True`) and the final read shows another "
        "artifact or none with no `forget`/`prune` since the call began; (4) a reader got a wrong value, "
        "or `ArtifactCorrupted`/`CorruptRecord` (a payload deleted or damaged while its record still "
        "named it). `reap`, `discard` and `force_release` never take an artifact away, so they excuse "
        "nothing here."
    )
    add(
        "- **Removals and exclusion**: only `force_release` (an operator's repair) may end a live lease "
        "early, and then its holder's later heartbeat and complete must be refused; `prune`, `reap`, "
        "`forget` and `discard` may only remove leases that had already expired, so they never excuse "
        "an overlap of two leases. *Newer* and *stale* tokens are judged by real time where two grant "
        "calls did not overlap, so that a fence that went backwards cannot hide a stale write."
    )
    add(
        "- **No payload lost** (the payload scenario): every miss a reader logged (a payload its record "
        "named, not there) is excused by a `forget` of its key since its artifact was stored; with no "
        "`prune` in that scenario, a payload a collection lost is also a lost artifact by the rule above."
    )
    add(
        "- **Every waiter returns** with the right value (or its own timeout where the scenario allows); "
        "nobody hangs; work runs once per key where nothing ended a lease early."
    )
    add(
        "- **Faults**: no corruption, every key completes after the faults end, an ambiguous outcome "
        "(the reply lost after the store acted) is resolved by re-reading, lost leases are logged, and "
        "the `on_store_unavailable` policy (`fail` raises, `run` runs unreserved) is honoured and logged."
    )
    add("")


def _results_section(
    add: Any, by_store: dict[str, dict[str, ScenarioResult]], unavailable: dict[str, str], sizes: Sizes
) -> None:
    add("## Results")
    add("")
    add("| store | scenario | trials | faults injected | violations | expected | time |")
    add("| --- | --- | ---: | --- | ---: | ---: | ---: |")
    for store, scenarios_of in by_store.items():
        for name, result in scenarios_of.items():
            title = _SCENARIO_TITLES.get(name, name)
            if result.skipped:
                add(f"| {store} | {title} | - | skipped: {result.skipped} | - | - | - |")
                continue
            add(
                f"| {store} | {title} | {result.trials} {result.trial_unit} | {_faults(result)} | "
                f"**{len(result.unexpected)}** | {len(result.expected)} | {result.seconds:.0f}s |"
            )
    for store, why in unavailable.items():
        add(f"| {store} | all | - | unavailable: {why} | - | - | - |")
    add("")
    if sizes:
        add(
            f"Sizes: contention {sizes.contention_procs} processes x {sizes.contention_keys} keys; "
            f"{sizes.kill_trials} SIGKILL trials per store (in batches of {sizes.kill_batch}); "
            f"{sizes.pause_trials} SIGSTOP trials; store faults for {sizes.fault_seconds:g}s with "
            f"{sizes.fault_procs} proxied processes and one direct bystander over {sizes.fault_keys} keys; "
            f"clock skew with {sizes.skew_procs} processes x {sizes.skew_keys} keys plus {sizes.skew_kills} "
            f"skewed SIGKILL trials; {sizes.fuzz_examples} fuzzed keys and as many fuzzed URLs per store; "
            f"removals (and payload collections) for {sizes.removal_seconds:g}s: {sizes.removal_procs} "
            f"computing processes over {sizes.removal_keys} keys, three removers, {sizes.removal_kills} "
            "killed holders."
        )
        add("")


def _payload_section(add: Any, by_store: dict[str, dict[str, ScenarioResult]]) -> None:
    results = [(store, of["payloads"]) for store, of in by_store.items() if "payloads" in of]
    if not results:
        return
    add("## Payload collection racing the scenario")
    add("")
    add(
        "The same shape with every artifact in a payload store (issue 31): a folder beside the SQL and "
        "Redis stores, fsspec's local file system (`local://`) beside the file store, Azure Blob beside "
        "the Azure store; inline limit 0, so every artifact is a reference to a payload. Half the keys "
        "share their value in pairs (one payload published under two keys), and every key forgotten is "
        "computed again with the same bytes: what a collection deciding to remove a payload races. The "
        "removers collect the payloads no record refers to, `forget` keys (whose payload is collected at "
        "once) and `reap`, with a grace of 0.05 s (Azure: 2 s, its times are whole seconds) instead of "
        "the default minute. Two run at once, the harness SIGSTOPs one of them at random; the third "
        "pauses at the steps of every collection it runs, up to half a ttl: always right before it "
        "removes a copy, a quarter of the time after listing the records or the copies "
        "(`reliability/workers.py`, `_pause_points`). No `prune`: a collection removes no artifact, so "
        "a payload lost is a key read as free while its record named the payload, which the checker "
        "flags as a lost artifact, and every miss a reader logged (*treated as missing*) must be excused "
        "by a `forget` of its key since its artifact was stored."
    )
    add("")
    add(
        "| store | payloads | compute calls | collections | forgets (removed) | copies removed | "
        "paused: after listing records / copies / a payload's copies / before removing a copy | "
        "collector SIGSTOPs | misses (after a forget) | violations |"
    )
    add("| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |")
    for store, result in results:
        if result.skipped:
            continue
        done = result.figures.get("removals", {})
        pauses = result.figures.get("pauses", {})
        paused = " / ".join(
            str(pauses.get(point, 0))
            for point in (
                "after listing the records",
                "after listing the copies",
                "after listing a payload's copies",
                "before removing a copy",
            )
        )
        add(
            f"| {store} | {result.figures.get('payloads', '-')} | {result.trials} | "
            f"{done.get('collect calls', 0)} | {done.get('forget calls', 0)} "
            f"({done.get('forget that removed', 0)}) | {done.get('copies removed', 0)} | {paused} | "
            f"{result.faults.get('SIGSTOP remover', 0)} | {result.figures.get('payload misses', 0)} "
            f"({result.figures.get('payload misses after a forget', 0)}) | **{len(result.unexpected)}** |"
        )
    add("")
    add(
        "Put back, the old folder store's put (a copy that is there already is only touched, its name "
        "reused) makes this scenario fail: at the reduced size, seeds 1 and 3 on SQLite found 7 and 5 "
        "violations (lost artifacts, readers' misses no forget excuses, a `PayloadUnavailable` raised to "
        "a caller)."
    )
    add("")


def _violations_section(add: Any, results: list[ScenarioResult]) -> None:
    add("## Violations")
    add("")
    unexpected = [(r, v) for r in results for v in r.unexpected]
    if unexpected:
        # Fuzzing finds one bug many times: group by where and which invariant, show one example.
        groups: dict[tuple[str, str, str], list[str]] = defaultdict(list)
        for result, violation in unexpected:
            groups[(result.store, result.scenario, violation.invariant)].append(str(violation))
        add(f"This run found **{len(unexpected)}** unexpected violation(s):")
        add("")
        for (store, scenario, invariant), found in groups.items():
            example = found[0].replace("\n", " ")[:600]
            add(f"- **{store} / {scenario} / {invariant}** ({len(found)}x), e.g. {example}")
        add("")
        if REPORTED:
            add(
                "Those in stores maintained separately are also listed under *Found in stores "
                "maintained separately* below."
            )
    else:
        add("This run found none.")
    add("")
    add("### Found by this suite and fixed in the core")
    add("")
    if FIXED:
        add("| violation | fix | regression test |")
        add("| --- | --- | --- |")
        for found, fix, tests in FIXED:
            names = "<br>".join(f"`{name}`" for name in tests.split(", "))
            add(f"| {found} | {fix} | {names} |")
    else:
        add("None.")
    add("")
    add("### Found by the removal scenario before issue 16's fix")
    add("")
    add(
        "Run against the code before the fix (`src/` as of commit f160cee, with "
        "`reliability/run --scenarios removal`, seed 20261125), the removal scenario found both defects "
        "of issue 16: 3034 violations over the six stores. With the fix it finds neither (the results above)."
    )
    add("")
    add("| violation | fix | regression test |")
    add("| --- | --- | --- |")
    for found, fix, tests in FOUND_BY_REMOVALS:
        names = "<br>".join(f"`{name}`" for name in tests.split(", "))
        add(f"| {found} | {fix} | {names} |")
    add("")
    add("### Found by probing with hostile input (issue 12), fixed, and checked here since")
    add("")
    add(
        "This suite did not catch these when they were found: its hostile cases did not plant them. "
        "Each class now has cases in the hostile-input scenario."
    )
    add("")
    add("| defect | fix | regression test |")
    add("| --- | --- | --- |")
    for found, fix, tests in HARDENED:
        names = "<br>".join(f"`{name}`" for name in tests.split(", "))
        add(f"| {found} | {fix} | {names} |")
    add("")
    if REPORTED:
        add("### Found in stores maintained separately (reported, and fixed there)")
        add("")
        for store, text in REPORTED:
            add(f"- **{store}**: {text}")
        add("")


def _limits_section(add: Any) -> None:
    add("## Limits of this suite")
    add("")
    add(
        "- PostgreSQL, MySQL and Redis are shared services here, so they are not restarted; a restart is "
        "simulated from the client's side by cutting every connection at once (the proxy's `cut`). "
        "Azurite, which this suite starts itself, is really stopped and started under load."
    )
    add(
        "- Partitions are stalls of the proxied traffic that heal (up to 1.6 x ttl). A peer that "
        "stays silent forever is not injected here; `tests/test_limits.py` checks that a PostgreSQL or "
        "MySQL call over a silent network ends with `StoreUnavailable` after the store's `timeout`."
    )
    add(
        "- Takeover latencies are wall-clock figures on a shared machine; pytest asserts only the "
        "invariants (and liveness with generous timeouts), never a latency."
    )
    add(
        "- Removers are paused at two chosen steps (after listing, after the read before a conditional "
        "write) by wrapping that remover process's own store object, and elsewhere only by SIGSTOPs at "
        "random moments; a pause between the two statements of one SQL transaction is not injected "
        "(the repairs run one statement each). A `prune` reports a count, not which keys it removed, so "
        "any `prune` that may have acted excuses a vanished artifact of any key of its namespace."
    )
    add("")


def _takeover_section(add: Any, by_store: dict[str, dict[str, ScenarioResult]]) -> None:
    add("## Takeover after SIGKILL (measured)")
    add("")
    add(
        "Time from the SIGKILL of a holder that held the lease to the moment a waiter's grant of the key "
        "returned. The lease outlives its holder by at most the ttl (its last heartbeat was at most one "
        "heartbeat interval before the kill), and waiters ask again right after the expiry they were "
        "told, so the bound is ttl + one heartbeat interval. *Closest* is the other side: over every "
        "takeover in the store's histories, the least time by which the new grant came after the ttl "
        "had run out since the old holder's last extension was sent (real time; negative is early)."
    )
    add("")
    add(
        "| store | ttl | bound | takeovers | min | median | p95 | max | within bound | closest | "
        "kill outcomes |"
    )
    add("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for store, scenarios_of in by_store.items():
        result = scenarios_of.get("kill")
        if result is None or result.skipped:
            continue
        figures = result.figures
        n, low, median, p95, high = _latency(figures)
        outcomes = ", ".join(
            f"{count} {what}" for what, count in sorted(figures.get("kill outcomes", {}).items())
        )
        closest = result.summary.closest_takeover
        add(
            f"| {store} | {figures.get('ttl', '-')}s | {figures.get('takeover_bound_seconds', '-')}s | {n} | "
            f"{low} | {median} | {p95} | {high} | {figures.get('takeovers_within_bound', '-')}/{n} | "
            f"{'-' if closest is None else f'{closest:+.3f}s'} | {outcomes} |"
        )
    add("")
    add(
        "Azure reads the service's clock from the `Date` header, which has one-second resolution (the "
        "store refines it with the client's monotonic clock, within that second). A takeover can "
        "therefore come up to a second before the ttl has run out in real time; the exclusion checks "
        "allow exactly that one second on Azure and nothing anywhere else. Use ttls well above a "
        "second there (the default is 60 s)."
    )
    add("")


def _pause_section(add: Any, by_store: dict[str, dict[str, ScenarioResult]]) -> None:
    add("## SIGSTOP past the ttl (fencing)")
    add("")
    add(
        "The holder is stopped right after a heartbeat, a successor waits out the ttl, takes over and "
        "completes; then the holder is resumed. Its next heartbeat and its complete must be rejected "
        "(`LeaseLost`), the successor's artifact must stay, and the resumed `Reservations.compute` must "
        "still return its own, correct value with `stored=False`."
    )
    add("")
    add("| store | trials | fenced out correctly | paused (median) |")
    add("| --- | ---: | ---: | ---: |")
    for store, scenarios_of in by_store.items():
        result = scenarios_of.get("pause")
        if result is None or result.skipped:
            continue
        paused = result.figures.get("paused_seconds") or {}
        add(
            f"| {store} | {result.trials} | {result.figures.get('fenced_out', 0)} | "
            f"{paused.get('median', '-')}s |"
        )
    add("")


def _faults_section(add: Any, by_store: dict[str, dict[str, ScenarioResult]]) -> None:
    add("## Store faults")
    add("")
    add(
        "A fault-injecting TCP proxy (`reliability/faults.py`) sits between the clients and the store. "
        "Every few hundred milliseconds it cuts every connection (RST), resets connections in the middle "
        "of a reply (the store already acted: the ambiguous case) or of a request, adds latency, or stalls "
        "all traffic, sometimes longer than the ttl so that proxied holders lose their leases to a "
        "bystander outside the partition. Then the store is made unreachable (every connection refused) "
        'for one process with `on_store_unavailable="fail"` and one with `"run"`. Azurite, owned by '
        "the suite, is also stopped and restarted under load."
    )
    add("")
    add(
        "| store | compute calls | faults | unavailable raised | unreserved runs | unstored results "
        "| leases lost | asks/s while waiting, connections cut |"
    )
    add("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for store, scenarios_of in by_store.items():
        result = scenarios_of.get("faults")
        if result is None:
            continue
        if result.skipped:
            add(f"| {store} | - | n/a: {result.skipped} | - | - | - | - | - |")
            continue
        s = result.summary
        spin = result.figures.get("most asks per second while waiting (connections cut)", "-")
        add(
            f"| {store} | {result.trials} | {_faults(result)} | {s.unavailable} | {s.unreserved_runs} | "
            f"{s.unstored_results} | {result.figures.get('leases lost and reported', 0)} | {spin} |"
        )
    add("")
    add(
        "*Unavailable raised*: calls under policy `fail` that got `StoreUnavailable` (each logged); "
        "*unreserved runs*: calls under policy `run` that ran the work without a lease (each logged); "
        "*unstored results*: calls whose lease was lost while they worked (fenced out, logged) and that "
        "returned their own value with `stored=False`. The last column is the most times one waiter "
        "asked within a second while its connections, the listening ones included, were being cut; "
        f"more than {SPIN_ASKS_PER_SECOND} is a violation (it would be spinning instead of backing off)."
    )
    add("")


def _skew_section(add: Any, by_store: dict[str, dict[str, ScenarioResult]]) -> None:
    add("## Client clock skew")
    add("")
    add(
        f"Some worker processes run with their wall clock {SKEW_SECONDS // 60} minutes ahead or behind "
        "(libfaketime: `LD_PRELOAD` and `FAKETIME`, monotonic clock untouched; each worker's skew is "
        "verified). They race on the same keys, and skewed holders are killed while skewed waiters "
        "(one ahead, one behind) wait. Stores that judge expiry by the service's clock must not notice. "
        "The file store and the embedded SQLite store judge it by each calling process's clock: on one "
        "machine all processes share that clock, so the limit is documented rather than fixed; here it "
        "shows as expected violations."
    )
    add("")
    add("| store | clock that judges expiry | trials | violations | expected violations | example |")
    add("| --- | --- | ---: | ---: | ---: | --- |")
    for store, scenarios_of in by_store.items():
        result = scenarios_of.get("skew")
        if result is None:
            continue
        if result.skipped:
            add(f"| {store} | - | - | skipped: {result.skipped} | - | - |")
            continue
        clock = "each process's own" if result.expected or store in ("file", "sqlite") else "the service's"
        example = str(result.expected[0]).replace("|", "\\|")[:220] if result.expected else ""
        kinds = Counter(v.invariant for v in result.expected)
        summary = ", ".join(f"{n} {kind}" for kind, n in kinds.items())
        add(
            f"| {store} | {clock} | {result.trials} | **{len(result.unexpected)}** | "
            f"{len(result.expected)}{f' ({summary})' if summary else ''} | {example} |"
        )
    add("")


def _hostile_section(add: Any, by_store: dict[str, dict[str, ScenarioResult]]) -> None:
    add("## Hostile and bad input")
    add("")
    add(
        "Each case plants one kind of bad input and checks what the contract asks of it "
        "(`reliability/hostile.py`): the `dibs.ReservationError` subclass the case names, with a message "
        "that names the bad value where the case says which (the key, the URL part, the setting); no "
        "password of the URLs (also one holding `?`, `#`, `/` or `@`) in the error, its chained causes, "
        "`repr(client)` or `store.url`; no work run and no code executed; a foreign or damaged record left "
        "as it was, except where the lease holder's own fenced write repairs it by design (SQL rows whose "
        "lease lost its expiry or attempt: the token is intact, so `complete`/`release` write a valid row); "
        "unreadable records skipped and counted by `ls` and `reap`, which keep serving the other keys; "
        "nothing printed raw by `ls`/`show`. These are the cases planted, not a proof about every input: "
        "an earlier version of this report claimed, more broadly, that every error named the bad value, "
        "that no secret ever appeared and that stored data was always left byte-for-byte; issue 12 found "
        "inputs for which none of the three held (see below)."
    )
    add("")
    categories: list[str] = []
    for scenarios_of in by_store.values():
        result = scenarios_of.get("hostile")
        if result is not None:
            for name in result.figures.get("cases", {}):
                if name not in categories:
                    categories.append(name)
    if not categories:
        return
    add("| store | " + " | ".join(categories) + " | violations |")
    add("| --- | " + " | ".join("---:" for _ in categories) + " | ---: |")
    for store, scenarios_of in by_store.items():
        result = scenarios_of.get("hostile")
        if result is None or result.skipped:
            continue
        cells = [str(result.figures.get("cases", {}).get(name, 0)) for name in categories]
        add(f"| {store} | " + " | ".join(cells) + f" | **{len(result.unexpected)}** |")
    add("")


def _removal_section(add: Any, by_store: dict[str, dict[str, ScenarioResult]]) -> None:
    add("## Removals racing the scenario")
    add("")
    add(
        "Records are removed while they are being used (issue 16). Processes compute the same keys again "
        "and again (ttl 1.5 s, work up to 0.8 s, so some leases are heartbeated and some not) while "
        "three removers run, each picking at random, every 10-150 ms: `prune(older_than=0)`, `reap`, "
        "`forget` of a key, or `force_release` then `discard` of a key (an operator freeing a stuck key "
        "for good). Two removers run at once; the harness SIGSTOPs one of them at random moments, "
        "whatever it is doing, and SIGCONTs it up to two ttls later; the third pauses inside its own "
        "removals (half the time, up to two ttls) right after listing the records it will remove, and "
        "right after reading the record it is about to change, before its compare-and-swap "
        "(`reliability/workers.py`, `_pause_points`: before the SQL stores' version-guarded statement, "
        "the file and Azure stores' conditional write; Redis decides in one script). Holders are "
        "SIGKILLed soon after their grant, so that expired leases are there for `reap` and `prune` "
        "to race the waiters that take them over. Then the removers stop, every key is computed once "
        "more, and read."
    )
    add("")
    add(
        "| store | compute calls | grants | prune | reap | forget | force_release + discard | "
        "paused inside a removal | remover SIGSTOPs | holders SIGKILLed | violations |"
    )
    add("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for store, scenarios_of in by_store.items():
        result = scenarios_of.get("removal")
        if result is None or result.skipped:
            continue
        done = result.figures.get("removals", {})
        cells = [
            f"{done.get(f'{kind} calls', 0)} ({done.get(f'{kind} that removed', 0)})"
            for kind in ("prune", "reap", "forget", "force_release+discard")
        ]
        add(
            f"| {store} | {result.trials} | {result.figures.get('grants', 0)} | " + " | ".join(cells) + " | "
            f"{result.faults.get('paused removals', 0)} | {result.faults.get('SIGSTOP remover', 0)} | "
            f"{result.faults.get('SIGKILL', 0)} | **{len(result.unexpected)}** |"
        )
    add("")
    add(
        "Each removal column: calls (of which removed or changed something). The violations are those of "
        "every check above (exclusion, fences, stale writes, no lost artifact, every caller returns the "
        "right value), over the whole history of the scenario."
    )
    add("")
