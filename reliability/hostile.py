"""Scenario 6: hostile and bad input. Every case must end in a clear dibs error, lose nothing, run nothing.

The contract's Bad input and Trust sections, checked case by case on one store:

* **fuzzed keys and namespaces** (hypothesis): a key is either rejected with
  :class:`~dibs.InvalidKey` naming the value, or it round-trips through the store (computed once,
  read back equal) without colliding with another key and without becoming a path outside the
  store (the file store's directory and the Azure container are walked afterwards);
* **malformed URLs and connection strings** (a curated list plus fuzzed ones): a
  :class:`~dibs.ReservationError` whose message names what is wrong and never contains a secret
  (also not in the chained cause a traceback would print), and no hang;
* **corrupted and foreign records** planted natively: every operation on the key raises an error
  naming it, runs no work, and leaves the record byte-for-byte as it was;
* **tampered artifacts**: :class:`~dibs.ArtifactCorrupted` naming the key, no work run, the
  payload left in place for inspection;
* **unsigned, mis-signed and foreign pickles**: refused before unpickling (a canary directory
  that the payload would create must not appear), with an error naming the key;
* **forged lease tokens and exports**: refused, the stored artifact untouched;
* **bad settings**: :class:`~dibs.ConfigurationError` naming the value.

Witness keys computed first must read back unchanged at the end: nothing stored is lost.
"""

from __future__ import annotations

import base64
import concurrent.futures
import hashlib
import hmac
import json
import logging
import os
import pickle
import re
import secrets
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dibs
from dibs.keys import Key
from dibs.serializers import SignedPickleSerializer, artifact_context
from dibs.stores import Store, open_store
from reliability.history import Violation
from reliability.workers import expected_value

if TYPE_CHECKING:
    from reliability.scenarios import Run

__all__ = ["run_all"]

SECRET = "s3cr3t-pw-7f3a"
SIGNING_KEY = b"reliability-signing-key-0123456789"
_URL_TIMEOUT = 30.0


class _Evil:
    """A pickle that creates a directory when unpickled: proof of code execution if it ever runs."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (self.path,))


class _HostileSerializer:
    """What an attacker with write access controls: any serializer name, any payload bytes."""

    def __init__(self, name: str, payload: bytes) -> None:
        self.name = name
        self._payload = payload

    def dumps(self, value: Any) -> bytes:
        return self._payload

    def loads(self, payload: bytes) -> Any:
        return payload


class Cases:
    """Runs cases and turns each wrong outcome into a :class:`Violation`."""

    def __init__(self, run: Run, store: Store) -> None:
        self.run = run
        self.store = store
        self.count = 0
        self.executions = 0

    def violation(self, invariant: str, key: str | None, detail: str) -> None:
        self.run.result.violations.append(Violation(invariant, key, detail))

    def client(self, namespace: str = "rel.hostile", **options: Any) -> dibs.Reservations:
        return dibs.Reservations(self.store, namespace=namespace, ttl=options.pop("ttl", 30.0), **options)

    def work(self, value: Any) -> Callable[[], Any]:
        def fn() -> Any:
            self.executions += 1
            return value

        return fn

    def expect_error(
        self,
        case: str,
        call: Callable[[], Any],
        *,
        kinds: tuple[type[BaseException], ...] = (dibs.ReservationError,),
        names: tuple[str, ...] = (),
        key: str | None = None,
        secret: str | None = None,
    ) -> BaseException | None:
        """Run ``call``: it must raise one of ``kinds``, mention one of ``names``, and never ``secret``."""
        self.count += 1
        try:
            call()
        except BaseException as exc:  # judged below
            message = str(exc)
            if not isinstance(exc, kinds):
                self.violation(
                    "clear errors",
                    key,
                    f"{case}: raised {type(exc).__name__} ({message[:200]}), "
                    f"not {' or '.join(k.__name__ for k in kinds)}",
                )
            elif names and not any(fragment and fragment in message for fragment in names):
                self.violation(
                    "clear errors", key, f"{case}: the message does not name {names[0]!r}: {message[:300]}"
                )
            if secret is not None:
                self._no_leak(case, exc, secret, key)
            return exc
        self.violation("clear errors", key, f"{case}: accepted without an error")
        return None

    def _no_leak(self, case: str, exc: BaseException, secret: str, key: str | None) -> None:
        seen: BaseException | None = exc
        depth = 0
        while seen is not None and depth < 10:
            fields = getattr(seen, "fields", {})
            text = f"{seen!s} {seen!r} {fields!r}"
            if secret in text:
                self.violation(
                    "no secret in errors",
                    key,
                    f"{case}: {type(seen).__name__} shows the secret: {text[:300]}",
                )
                return
            seen = seen.__cause__ or seen.__context__
            depth += 1


def run_all(run: Run) -> None:
    store = run.target.open()
    cases = Cases(run, store)
    counts: dict[str, int] = {}
    try:
        witnesses = _witnesses(cases)
        for name, part in (
            ("bad settings", _bad_settings),
            ("fuzzed keys", _fuzzed_keys),
            ("malformed URLs", _bad_urls),
            ("corrupted records", _corrupted_records),
            ("tampered artifacts", _tampered_artifacts),
            ("hostile pickles", _hostile_pickles),
            ("forged leases", _forged_leases),
            ("leaked credentials", _credentials),
            ("durations", _durations),
            ("limits", _limits),
            ("owners and printing", _owners),
            ("special files", _special_files),
        ):
            before = cases.count
            part(cases)
            counts[name] = cases.count - before
        _check_witnesses(cases, witnesses)
        _no_paths_outside(cases)
    finally:
        store.close()
    run.result.trials = cases.count
    run.result.trial_unit = "hostile or malformed inputs"
    run.result.faults.update(counts)
    run.result.figures["cases"] = counts


# -- witnesses ---------------------------------------------------------------------------------------


def _witnesses(cases: Cases) -> dict[str, Any]:
    client = cases.client("rel.witness")
    values = {f"witness-{i}": expected_value(f"witness-{i}") for i in range(5)}
    for name, value in values.items():
        client.run(name, cases.work(value))
    return values


def _check_witnesses(cases: Cases, values: dict[str, Any]) -> None:
    client = cases.client("rel.witness")
    before = cases.executions
    for name, value in values.items():
        try:
            got = client.run(name, cases.work("recomputed"))
        except dibs.ReservationError as exc:
            cases.violation("nothing stored lost", name, f"the witness cannot be read back: {exc}")
            continue
        if got != value:
            cases.violation("nothing stored lost", name, f"the witness now reads {got!r}")
    if cases.executions != before:
        cases.violation("nothing stored lost", None, "a witness key was computed again")


# -- bad settings ------------------------------------------------------------------------------------


def _bad_settings(cases: Cases) -> None:
    store = cases.store
    for value in (0, -1, float("nan"), float("inf"), "10", True, None, [1]):
        cases.expect_error(
            f"ttl={value!r}",
            lambda v=value: dibs.Reservations(store, ttl=v),
            kinds=(dibs.ConfigurationError,),
            names=(repr(value), str(value)),
        )
    settings: list[tuple[str, dict[str, Any], str]] = [
        ("heartbeat_interval >= ttl", {"ttl": 10, "heartbeat_interval": 10}, "heartbeat_interval"),
        ("max_lease_age < ttl", {"ttl": 10, "max_lease_age": 5}, "max_lease_age"),
        ("max_failures=0", {"max_failures": 0}, "0"),
        ("max_failures='3'", {"max_failures": "3"}, "'3'"),
        ("on_store_unavailable='maybe'", {"on_store_unavailable": "maybe"}, "maybe"),
        ("serializer='yaml'", {"serializer": "yaml"}, "yaml"),
        ("pickle without a signing key", {"serializer": "pickle"}, "signing_key"),
        ("short signing key", {"serializer": "pickle", "signing_key": "short"}, "16 bytes"),
        ("serializer=42", {"serializer": 42}, "42"),
        ("namespace='../etc'", {"namespace": "../etc"}, "'../etc'"),
        ("namespace=''", {"namespace": ""}, "''"),
        ("namespace=None", {"namespace": None}, "None"),
    ]
    for case, options, fragment in settings:
        cases.expect_error(
            case,
            lambda o=options: dibs.Reservations(store, **o),
            kinds=(dibs.ConfigurationError,),
            names=(fragment,),
        )
    client = cases.client()
    cases.expect_error(
        "timeout=-1",
        lambda: client.compute("t", cases.work(1), timeout=-1),
        kinds=(dibs.ConfigurationError,),
        names=("-1",),
    )
    cases.expect_error(
        "Backoff(initial=0)",
        lambda: dibs.Backoff(initial=0),
        kinds=(dibs.ConfigurationError,),
        names=("initial",),
    )


# -- fuzzed keys ---------------------------------------------------------------------------------------

TRICKY_NAMES = [
    "../../etc/passwd",
    "..",
    ".",
    "/",
    "a/../../b",
    "%2e%2e%2f",
    "..\\..\\windows",
    "CON",
    "nul",
    " ",
    "  x  ",
    "ключ",
    "🔑 key",
    "*",
    "?",
    "[a-z]",
    "rec:*",
    "{x}",
    "'; DROP TABLE dibs_reservations; --",
    "\u202eevil",
    "\ud800",
    "\x00",
    "a\nb",
    "\t",
    "x" * 1024,
    "x" * 1025,
    "s3://bucket/part-0",
    "C:\\path",
    "records/ab/..",
    "dibs-store.json",
    "%00",
    "\u3000",
    "\uff46\uff55\uff4c\uff4c",
    "e\u0301",
    "é",
]
TRICKY_NAMESPACES = [
    "default",
    "team.features",
    "a.b-c_d",
    "x" * 200,
    "x" * 201,
    "..",
    ".a",
    "a.",
    "-a",
    "a b",
    "ns/evil",
    "a..b",
    "ключ",
    "a\x00",
    "",
    "a.-b",
    "_",
    "0",
]


def _fuzzed_keys(cases: Cases) -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as fixed_seed
    from hypothesis import strategies as st

    names = st.one_of(
        st.sampled_from(TRICKY_NAMES),
        st.text(max_size=40),
        st.text(alphabet="ab./\\%:*?", min_size=1, max_size=30),
        st.text(min_size=1020, max_size=1030, alphabet="ab/."),
    )
    namespaces = st.one_of(
        st.sampled_from(TRICKY_NAMESPACES),
        st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,8}(\.[A-Za-z0-9_-]{1,6}){0,3}", fullmatch=True),
        st.text(max_size=20),
    )
    digests: dict[str, tuple[str, str]] = {}
    clients: dict[str, dibs.Reservations] = {}

    def one(namespace: Any, name: Any) -> None:
        cases.count += 1
        try:
            key = Key(namespace, name)
        except dibs.InvalidKey as exc:
            shown = [repr(name)[:20], repr(namespace)[:20]]
            if "" in (name, namespace):  # an empty value is named by saying so
                shown.append("empty")
            if not any(fragment and fragment in str(exc) for fragment in shown):
                cases.violation(
                    "clear errors", None, f"InvalidKey for {namespace!r}/{name!r:.60} does not name it: {exc}"
                )
            return
        except Exception as exc:  # anything but InvalidKey is a finding
            cases.violation(
                "clear errors", None, f"Key({namespace!r}, {name!r:.60}) raised {type(exc).__name__}: {exc}"
            )
            return
        # Names are NFC-normalized (issue 16): "e\u0301" and "é" are one key, so compare keys as made.
        other = digests.setdefault(key.digest, (key.namespace, key.name))
        if other != (key.namespace, key.name):
            cases.violation("key isolation", str(key), f"same digest as {other!r}")
        client = clients.get(namespace) or clients.setdefault(namespace, cases.client(namespace))
        value = expected_value(str(key))
        try:
            first = client.run(name, cases.work(value))
            before = cases.executions
            again = client.run(name, cases.work("recomputed"))
        except dibs.ReservationError as exc:
            cases.violation(
                "clear errors", str(key)[:80], f"a valid key failed on the store: {type(exc).__name__}: {exc}"
            )
            return
        except Exception as exc:
            cases.violation(
                "clear errors", str(key)[:80], f"a valid key crashed the store: {type(exc).__name__}: {exc}"
            )
            return
        if first != value or again != value or cases.executions != before:
            cases.violation("key isolation", str(key)[:80], f"round trip gave {first!r} then {again!r}")

    fuzz = settings(
        max_examples=cases.run.sizes.fuzz_examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )(fixed_seed(cases.run.seed)(given(namespace=namespaces, name=names)(one)))
    fuzz()
    for name in TRICKY_NAMES:  # every curated value at least once, whatever hypothesis drew
        one("rel.fuzz", name)
    for namespace in TRICKY_NAMESPACES:
        one(namespace, "a")


#: Every name the file store gives a file or folder: derived from a key's digest, never from the key.
#: A file is written under a hidden temporary name beside its final one and renamed into place; a
#: writer SIGKILLed in between (the kill and pause scenarios run on the same folder before this one)
#: leaves that ``.<name>.<random>.tmp`` behind, as the file store documents: named from the digest
#: like every other file, so no path traversal.
_FILE_NAME = r"(dibs-store\.json|[0-9a-f]{64}(\.json|\.lock|-\d+\.bin))"
#: The index's folders and files (dibs.stores.file_index): digests of namespaces and keys, times.
_INDEX_NAMES = (
    r"index|live|made|a|f|ready|\.ready\.[0-9a-f]{16}\.tmp|[0-9a-f]{32}|[0-9a-f]{64}|\d{17}-[0-9a-f]{64}"
)
_STORE_NAMES = re.compile(
    rf"(records|artifacts|locks|[0-9a-f]{{2}}|{_FILE_NAME}|\.{_FILE_NAME}\.[0-9a-f]{{16}}\.tmp|{_INDEX_NAMES})"
)


def stray_files(folder: Path) -> list[Path]:
    """Paths below ``folder`` (which holds the file store in ``store/``) that the store did not name."""
    stray = []
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if relative.parts[0] != "store" or not all(_STORE_NAMES.fullmatch(p) for p in relative.parts[1:]):
            stray.append(relative)
    return stray


def _no_paths_outside(cases: Cases) -> None:
    """Keys never become paths: the file store's folder and the Azure container hold only digests."""
    target = cases.run.target
    if target.name == "file":
        for relative in stray_files(target.folder):  # type: ignore[attr-defined]
            cases.violation("no path traversal", None, f"unexpected file in the store folder: {relative}")
    if target.name == "azure":
        container = cases.store._container  # type: ignore[attr-defined]
        pattern = re.compile(
            r"rel/(records/[0-9a-f]{64}|artifacts/[0-9a-f]{64}-\d+-[0-9a-f]{32}"
            r"|index/(ready|live/[0-9a-f]{32}/[0-9a-f]{64}|made/[af]/[0-9a-f]{32}/\d{17}-[0-9a-f]{64}))"
        )
        for props in container.list_blobs():
            if not pattern.fullmatch(props.name):
                cases.violation("no path traversal", None, f"unexpected blob name: {props.name}")


# -- malformed URLs -----------------------------------------------------------------------------------


#: The URL schemes whose parsing each store's run checks ("" and unknown schemes: no store at all).
URL_SCHEMES = {
    "sqlite": ("sqlite", "", "nonsense", "ftp", "memory", "x"),
    "postgres": ("postgresql+psycopg", "postgres", "postgresql", "postgresql+nodriver"),
    "mysql": ("mysql+pymysql", "mysql", "mariadb"),
    "redis": ("redis", "rediss"),
    "file": ("file",),
    "azure": ("azure",),
}


def _url_cases(scratch: Path) -> list[tuple[str, tuple[str, ...], str | None]]:
    """(url, fragments of which the message must name one, secret that must not appear)."""
    s = SECRET
    quoted = urllib.parse.quote
    return [
        ("", ("''",), None),
        ("nonsense", ("nonsense",), None),
        ("ftp://host/path", ("ftp",), None),
        ("sqlite://", ("sqlite",), None),
        ("sqlite:///:memory:", ("memory",), None),
        ("sqlite:////nonexistent-dibs-folder/sub/dibs.db", ("nonexistent-dibs-folder",), None),
        (f"sqlite:///{scratch}/a.db?synchronous=SOMETIMES", ("SOMETIMES",), None),
        (f"sqlite:///{scratch}/a.db?busy_timeout=soon", ("soon",), None),
        (f"sqlite:///{scratch}/a.db?table=bad;name", ("bad;name",), None),
        (f"postgresql+psycopg://user:{s}@127.0.0.1:1/db", ("127.0.0.1", "user"), s),
        (f"postgresql+nodriver://user:{s}@127.0.0.1:1/db", ("nodriver",), s),
        (f"postgresql+psycopg://user:{s}@127.0.0.1:1/db?schema=bad-schema!", ("bad-schema!",), s),
        (f"postgresql+psycopg://user:{s}@127.0.0.1:notaport/db", ("notaport",), s),
        (f"mysql+pymysql://root:{s}@127.0.0.1:1/test", ("127.0.0.1", "root"), s),
        (f"mysql+pymysql://root:{s}@127.0.0.1:1/test?table=x%00y", ("table",), s),
        (f"redis://:{s}@127.0.0.1:6379/0?prefix=bad prefix*", ("prefix",), s),
        (f"redis://user:{s}@127.0.0.1:6379/notanumber", ("notanumber",), s),
        (f"redis://:{s}@127.0.0.1:6379/0?socket_timeout=soon", ("soon", "socket_timeout"), s),
        (f"redis://:{s}@127.0.0.1:99999/0", ("99999",), s),
        (f"redis://:{s}@127.0.0.1:6379/0?unknown_option=1", ("unknown_option",), s),
        ("file://relative/path", ("relative",), None),
        ("file:///nonexistent-dibs-folder/store", ("nonexistent-dibs-folder",), None),
        (f"file://{scratch}/store?lock_timeout=-1", ("lock_timeout",), None),
        (f"file://{scratch}/store?unknown=1", ("unknown",), None),
        ("azure://UPPER?account_url=https://a.blob.core.windows.net", ("UPPER",), None),
        (f"azure://user:{s}@account/container", ("container",), s),
        (
            f"azure://container?account_url=https://a.blob.core.windows.net&account_key={s}!!",
            ("account_key",),
            s,
        ),
        (
            "azure://container?connection_string="
            + quoted(f"AccountName=a;AccountKey={s};BlobEndpoint=garbage", safe=""),
            ("connection_string", "container"),
            s,
        ),
        (
            f"azure://container?account_url=https://a.blob.core.windows.net&sv=2020-01-01&sig={s}",
            ("sig", "SAS"),
            s,
        ),
        ("azure://container/../escape?account_url=https://a.blob.core.windows.net", ("..",), None),
        (f"azure://container?account_url=https://user:{s}@a.blob.core.windows.net", ("account_url",), s),
    ]


def _open_and_use(url: str) -> None:
    """Open the store and read one key: some stores only contact the service on first use."""
    store = open_store(url)
    try:
        store.read(Key("rel.urls", "probe"))
    finally:
        store.close()


def _bad_urls(cases: Cases) -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as fixed_seed
    from hypothesis import strategies as st

    scratch = cases.run.folder / "urls"
    scratch.mkdir(parents=True, exist_ok=True)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=4)

    def attempt(case: str, url: str, names: tuple[str, ...], secret: str | None, must_fail: bool) -> None:
        future = pool.submit(_open_and_use, url)

        def wait() -> None:
            try:
                future.result(timeout=_URL_TIMEOUT)
            except concurrent.futures.TimeoutError:
                cases.violation(
                    "no hang", None, f"{case}: opening the store did not return in {_URL_TIMEOUT:g}s"
                )

        if must_fail:
            cases.expect_error(case, wait, names=names, secret=secret)
            return
        cases.count += 1
        try:
            wait()
        except dibs.ReservationError as exc:
            if secret:
                cases._no_leak(case, exc, secret, None)
        except Exception as exc:
            cases.violation("clear errors", None, f"{case}: raised {type(exc).__name__}: {str(exc)[:200]}")

    # Each store's run checks its own URL schemes (the SQLite run, the default store, also the URLs
    # that name no store at all), so a finding is reported once, against the store it concerns.
    own = URL_SCHEMES[cases.run.target.name]
    for url, names, secret in _url_cases(scratch):
        scheme = url.split("://", 1)[0] if "://" in url else ""
        if scheme in own or (scheme.split("+")[0] in own):
            attempt(f"URL {url[:90]!r}", url, names, secret, must_fail=True)

    schemes = st.sampled_from(own)
    # Only addresses where nothing listens: a fuzzed URL must never reach (or create tables in) a real
    # service, nor wait for a DNS lookup.
    hosts = st.sampled_from(
        [
            "127.0.0.1:1",
            f"user:{SECRET}@127.0.0.1:1",
            "[::1]:1",
            "127.0.0.1:x",
            "127.0.0.1:99999",
            "u@127.0.0.1:1",
        ]
    )
    rests = st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), max_size=30)

    def fuzzed(scheme: str, host: str, rest: str) -> None:
        if scheme in ("sqlite", "file"):  # never let a fuzzed path land outside the scratch folder
            url = f"{scheme}://{scratch}/{rest.replace('/', '_').replace('.', '_')}"
        else:
            url = f"{scheme}://{host}/{rest}"
        attempt(f"fuzzed URL {url[:90]!r}", url, (), SECRET, must_fail=False)

    settings(
        max_examples=cases.run.sizes.fuzz_examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )(fixed_seed(cases.run.seed)(given(scheme=schemes, host=hosts, rest=rests)(fuzzed)))()
    pool.shutdown(wait=False, cancel_futures=True)


# -- corrupted and foreign records ---------------------------------------------------------------------


def _names_key(key: Key) -> tuple[str, ...]:
    return (str(key), key.name, key.digest)


def _corrupted_records(cases: Cases) -> None:
    target, store = cases.run.target, cases.store
    client = cases.client("rel.corrupt", ttl=300.0)
    client.run("readable", cases.work(1))
    for i, (kind, corrupt) in enumerate(target.corruptions().items()):
        key = Key("rel.corrupt", f"victim-{i}")
        got = client.get_or_reserve(key)
        assert isinstance(got, dibs.Acquired), got
        lease = got.lease
        corrupt(store, key)
        planted = target.snapshot(store, key)
        before = cases.executions
        names = _names_key(key)
        what = f"record with {kind}"
        cases.expect_error(f"read of a {what}", lambda k=key: client.status(k), names=names, key=str(key))
        cases.expect_error(
            f"reserve on a {what}",
            lambda k=key: client.get_or_reserve(k, owner="other"),
            names=names,
            key=str(key),
        )
        cases.expect_error(
            f"re-entry on a {what}",
            lambda k=key, o=lease.owner: client.get_or_reserve(k, owner=o),
            names=names,
            key=str(key),
        )
        cases.expect_error(
            f"compute on a {what}",
            lambda k=key: client.compute(k, cases.work("x"), timeout=5),
            names=names,
            key=str(key),
        )
        # One bad record never breaks the admin tools: listed as skipped, the other keys still served.
        cases.count += 1
        try:
            listing = client.list(all_namespaces=True)
            names = {state.key.name for state in listing}
            skipped = [entry.where for entry in getattr(listing, "skipped", ())]
            if "readable" not in names or not any(key.digest in where for where in skipped):
                cases.violation(
                    "unreadable records skipped", str(key), f"ls with a {what}: {sorted(names)}, {skipped}"
                )
            client.reap(all_namespaces=True)
        except Exception as exc:
            cases.violation(
                "unreadable records skipped",
                str(key),
                f"ls or reap with a {what} raised {type(exc).__name__}: {exc}",
            )
        if target.snapshot(store, key) != planted:
            cases.violation("nothing overwritten", str(key), f"the {what} was changed by another client")
        # The holder's own fenced writes: refused (record untouched), or, where the store lets the
        # token repair its own damaged row, accepted only if they leave a valid record behind.
        for action, write in (
            ("heartbeat", lease.heartbeat),
            ("complete", lambda held=lease: held.complete("overwrite")),
            ("release", lambda held=lease: held.release("overwrite")),
        ):
            if kind in target.repairable:
                cases.count += 1
                try:
                    write()
                except dibs.ReservationError:
                    continue
                try:
                    client.status(key)
                except dibs.ReservationError as exc:
                    cases.violation(
                        "nothing overwritten", str(key), f"the holder's {action} left a corrupt record: {exc}"
                    )
            else:
                cases.expect_error(f"{action} on a {what}", write, names=names, key=str(key))
        if kind not in target.repairable and target.snapshot(store, key) != planted:
            cases.violation("nothing overwritten", str(key), f"the {what} was changed by dibs")
        if cases.executions != before:
            cases.violation("nothing run", str(key), f"work ran on a key whose record has {kind}")


def _tampered_artifacts(cases: Cases) -> None:
    target, store = cases.run.target, cases.store
    client = cases.client("rel.tamper")
    key = Key("rel.tamper", "tampered")
    client.run(key, cases.work(expected_value("tampered")))
    target.tamper(store, key)
    tampered = target.snapshot(store, key)
    before = cases.executions
    names = _names_key(key)
    cases.expect_error(
        "compute on a tampered artifact",
        lambda: client.compute(key, cases.work("x")),
        kinds=(dibs.ArtifactCorrupted,),
        names=names,
        key=str(key),
    )
    cases.expect_error(
        "reserve on a tampered artifact",
        lambda: client.get_or_reserve(key),
        kinds=(dibs.ArtifactCorrupted,),
        names=names,
        key=str(key),
    )
    cases.expect_error(
        "wait on a tampered artifact",
        lambda: client.wait(key, timeout=5),
        kinds=(dibs.ArtifactCorrupted,),
        names=names,
        key=str(key),
    )
    if cases.executions != before:
        cases.violation("nothing run", str(key), "work ran although the key has a (tampered) artifact")
    if target.snapshot(store, key) != tampered:
        cases.violation(
            "nothing overwritten", str(key), "the tampered artifact was changed: it must stay for inspection"
        )


# -- hostile pickles -----------------------------------------------------------------------------------


def _hostile_pickles(cases: Cases) -> None:
    canary = cases.run.folder / "canary-code-ran"
    body = pickle.dumps(_Evil(str(canary)))
    attacker_key = b"attacker-key-not-the-readers-0123"
    payloads = {
        "unsigned pickle under the signed name": ("pickle-hmac-sha256", b"\x00" * 32 + body),
        "pickle signed with another key": (
            "pickle-hmac-sha256",
            hmac.new(attacker_key, body, hashlib.sha256).digest() + body,
        ),
        "raw pickle": ("pickle", body),
        "short signed payload": ("pickle-hmac-sha256", b"\x01\x02"),
        # Signed with the readers' own key, but for another key: a copy from where it belongs.
        "pickle signed for another key": (
            "pickle-hmac-sha256",
            SignedPickleSerializer(SIGNING_KEY).dumps(
                _Evil(str(canary)), context=artifact_context(Key("rel.pickle", "elsewhere"), 1)
            ),
        ),
    }
    plain = cases.client("rel.pickle")
    signed = cases.client("rel.pickle", serializer="pickle", signing_key=SIGNING_KEY)
    for i, (case, (name, payload)) in enumerate(payloads.items()):
        key = Key("rel.pickle", f"hostile-{i}")
        writer = cases.client("rel.pickle", serializer=_HostileSerializer(name, payload))
        writer.run(key, lambda: None)
        before = cases.executions
        names = _names_key(key)
        cases.expect_error(
            f"{case}, read without a signing key",
            lambda k=key: plain.compute(k, cases.work("x")),
            kinds=(dibs.SerializationError, dibs.ArtifactCorrupted),
            names=names,
            key=str(key),
        )
        cases.expect_error(
            f"{case}, read with the signing key",
            lambda k=key: signed.compute(k, cases.work("x")),
            kinds=(dibs.SerializationError, dibs.ArtifactCorrupted),
            names=names,
            key=str(key),
        )
        if cases.executions != before:
            cases.violation("nothing run", str(key), f"{case}: work ran although the key has an artifact")
    if canary.exists():
        cases.violation(
            "no code executed", None, "a hostile pickle was unpickled: the canary directory exists"
        )


# -- forged leases -------------------------------------------------------------------------------------


def _forged_leases(cases: Cases) -> None:
    client = cases.client("rel.forged", ttl=120.0)
    for garbage in (
        "",
        "dibs-lease:",
        "dibs-lease:!!!",
        "dibs-lease:" + base64.urlsafe_b64encode(b"[1, 2]").decode(),
        "not-a-lease",
        "dibs-lease:" + base64.urlsafe_b64encode(b'{"namespace": "x"}').decode(),
    ):
        cases.expect_error(
            f"resume({garbage[:30]!r})",
            lambda g=garbage: client.resume(g),
            kinds=(dibs.ConfigurationError,),
            names=("exported",),
        )
    key = Key("rel.forged", "forged")
    got = client.get_or_reserve(key)
    assert isinstance(got, dibs.Acquired)
    real = got.lease
    doc = json.loads(base64.urlsafe_b64decode(real.export().removeprefix("dibs-lease:")))
    forgeries = {
        "a guessed lease id": {**doc, "lease_id": secrets.token_hex(16)},
        "the next fence": {**doc, "fence": doc["fence"] + 1},
        "another owner": {**doc, "owner": "attacker"},
    }
    for case, forged in forgeries.items():
        exported = "dibs-lease:" + base64.urlsafe_b64encode(json.dumps(forged).encode()).decode()
        if case == "another owner":  # the owner is not part of the token: this one *is* the lease
            continue
        cases.expect_error(
            f"resume with {case}",
            lambda e=exported: client.resume(e),
            kinds=(dibs.LeaseLost,),
            names=_names_key(key),
            key=str(key),
        )
        fake = client.resume(exported, verify=False)
        cases.expect_error(
            f"complete with {case}",
            lambda f=fake: f.complete("forged value"),
            kinds=(dibs.LeaseLost,),
            names=_names_key(key),
            key=str(key),
        )
    real.complete(expected_value("forged"))
    if client.run(key, cases.work("recomputed")) != expected_value("forged"):
        cases.violation("nothing overwritten", str(key), "a forged token changed the artifact")


# -- credentials (issue 12, class 1) -----------------------------------------------------------------------

#: Passwords holding every character that cuts a URL short when pasted unencoded; TAIL must never show.
TAIL = "tail-5e1b9c"
NASTY_PASSWORDS = [f"pw?{TAIL}", f"pw#{TAIL}", f"pw/{TAIL}", f"pw@{TAIL}", f"p?w#x/y@{TAIL}"]

#: Per store run, URLs (``{pw}`` is the password) naming nothing that answers.
CREDENTIAL_URLS = {
    "sqlite": ("redis:/:{pw}@127.0.0.1:1/0", "user:{pw}@127.0.0.1/db"),
    "postgres": ("postgresql+psycopg://dibs:{pw}@127.0.0.1:1/db",),
    "mysql": ("mysql+pymysql://root:{pw}@127.0.0.1:1/test",),
    "redis": ("redis://:{pw}@127.0.0.1:1/0", "rediss://user:{pw}@127.0.0.1:1/0"),
    "file": ("file://user:{pw}@localhost/tmp/dibs",),
    "azure": ("azure://container?account_url=https://user:{pw}@a.blob.core.windows.net",),
}


def _credentials(cases: Cases) -> None:
    """No part of a password reaches an error, a ``repr``, ``store.url`` or a log line, however written."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=2)
    for template in CREDENTIAL_URLS[cases.run.target.name]:
        for password in NASTY_PASSWORDS:
            url = template.format(pw=password)
            case = f"password {password!r} in {template.split(':', 1)[0]} URL"
            future = pool.submit(_open_and_use, url)

            def wait(f: concurrent.futures.Future[None] = future, c: str = case) -> None:
                try:
                    f.result(timeout=_URL_TIMEOUT)
                except concurrent.futures.TimeoutError:
                    cases.violation("no hang", None, f"{c}: opening the store did not return")

            cases.expect_error(case, wait, secret=TAIL)
            cases.count += 1
            try:
                client = dibs.Reservations(url, on_store_unavailable="run")
            except dibs.ReservationError as exc:
                cases._no_leak(f"{case}, policy run", exc, TAIL, None)
                continue
            except Exception as exc:
                cases.violation("clear errors", None, f"{case}, policy run: {type(exc).__name__}: {exc}")
                continue
            shown = f"{client!r} {client.store.url}"
            if TAIL in shown:
                cases.violation("no secret in errors", None, f"{case}: repr or url shows it: {shown[:200]}")
    pool.shutdown(wait=False, cancel_futures=True)


# -- durations (class 2) -----------------------------------------------------------------------------------


def _durations(cases: Cases) -> None:
    """Every duration is bounded: NaN, infinities and values beyond ten years are refused, by name."""
    store = cases.store
    client = cases.client("rel.durations")
    settings: dict[str, Callable[[Any], Any]] = {
        "ttl": lambda v: dibs.Reservations(store, ttl=v),
        "heartbeat_interval": lambda v: dibs.Reservations(store, ttl=3e8, heartbeat_interval=v),
        "max_lease_age": lambda v: dibs.Reservations(store, max_lease_age=v),
        "timeout": lambda v: client.compute("t", cases.work(1), timeout=v),
        "backoff maximum": lambda v: dibs.Backoff(maximum=v, notify_maximum=max(10.0, v)),
        "heartbeat_interval ": lambda v: _keep_alive_with(client, v),  # Lease.keep_alive(interval)
    }
    for value in (3e10, 1e300, float("inf"), float("nan"), -5.0):
        for name, give in settings.items():
            cases.expect_error(
                f"{name}={value!r}",
                lambda g=give, v=value: g(v),
                kinds=(dibs.ConfigurationError,),
                names=(name.strip(),),
            )


def _keep_alive_with(client: dibs.Reservations, interval: float) -> None:
    got = client.get_or_reserve("keep-alive", owner="rel.durations")
    assert isinstance(got, dibs.Acquired), got
    try:
        got.lease.keep_alive(interval)
    finally:
        got.lease.release()


# -- limits of stored numbers (classes 4 and 5) -------------------------------------------------------------


def _limits(cases: Cases) -> None:
    """Records at the edges of what stores hold: a dibs error or an exact answer, never a raw exception."""
    from dibs.records import MAX_COUNT, MAX_FENCE

    target, store = cases.run.target, cases.store
    client = cases.client("rel.limits")

    def planted(name: str, field: str, value: Any, *, held: bool = False) -> Key:
        key = Key("rel.limits", name)
        got = client.get_or_reserve(key, owner="planter")
        assert isinstance(got, dibs.Acquired), got
        if not held:
            got.lease.release()
        target.set_field(store, key, field, value)
        return key

    def guarded(case: str, key: Key, check: Callable[[], None]) -> None:
        cases.count += 1
        try:
            check()
        except dibs.ReservationError as exc:
            cases.violation("clear errors", str(key), f"{case}: {type(exc).__name__}: {exc}")
        except Exception as exc:
            cases.violation("clear errors", str(key), f"{case}: raised {type(exc).__name__}: {exc}")

    key = planted("max-fence", "fence", MAX_FENCE)
    before = cases.executions
    cases.expect_error(
        "compute at the largest fence",
        lambda: client.compute(key, cases.work("x")),
        kinds=(dibs.CorruptRecord,),
        names=(str(MAX_FENCE),),
        key=str(key),
    )
    if cases.executions != before:
        cases.violation("nothing run", str(key), "work ran on a key whose fence cannot go higher")

    key = planted("big-fence", "fence", 2**53 + 1)

    def exact() -> None:
        report = client.compute(key, cases.work(expected_value("big-fence")))
        state = client.status(key)
        if (report.token, state.fence, state.artifact and state.artifact.fence) != (2**53 + 2,) * 3:
            cases.violation(
                "fencing", str(key), f"fence 2**53+1 went to {state.fence} (token {report.token})"
            )

    guarded("a fence above 2**53", key, exact)

    key = planted("max-attempts", "attempts", MAX_COUNT)

    def saturated() -> None:
        client.compute(key, cases.work(1))
        if client.status(key).attempts != MAX_COUNT:
            cases.violation("clear errors", str(key), f"attempts went past {MAX_COUNT}")

    guarded("attempts at the largest count", key, saturated)

    for value in (1e300, float("inf")):
        if value == float("inf") and target.name == "mysql":
            continue  # a MySQL DOUBLE cannot hold it
        key = planted(f"expiry-{value!r}", "expires_at", value, held=True)
        cases.expect_error(
            f"an expiry of {value!r}",
            lambda k=key: client.status(k),
            kinds=(dibs.CorruptRecord,),
            names=("expires_at",),
            key=str(key),
        )

    _deep_value(cases, client)


def _deep_value(cases: Cases, client: dibs.Reservations) -> None:
    """A value nested too deep to serialize: the hold loop's rule is to return it to its own run, not
    stored, and to release the lease with the reason recorded, so waiters compute for themselves."""
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    key = Key("rel.limits", "deep")
    cases.count += 1
    try:
        report = client.compute(key, lambda: deep)
    except Exception as exc:
        cases.violation("clear errors", str(key), f"a 100,000-deep value raised {type(exc).__name__}: {exc}")
        return
    state = client.status(key)
    if report.value is not deep or report.stored:
        cases.violation("clear errors", str(key), "a 100,000-deep value was not returned unstored")
    if state.lease is not None:
        cases.violation("nothing run", str(key), "the lease stayed held after the value failed to serialize")
    if state.failure is None or "nested" not in state.failure.error:
        cases.violation("clear errors", str(key), f"the failure recorded does not say why: {state.failure}")


# -- owners and what is printed (class 5) --------------------------------------------------------------------

HOSTILE_OWNER = "\x1b]0;owned\x07\x1b[2J\u202eevil\r\nforged"


def _owners(cases: Cases) -> None:
    """Owners dibs cannot store are refused before anything is written; foreign ones print safely."""
    client = cases.client("rel.owners")
    for owner in (5, b"bytes", "a\x00b", "\x1b[2J", HOSTILE_OWNER, "x" * 3000):
        key = Key("rel.owners", f"refused-{len(str(owner))}")
        cases.expect_error(
            f"owner {owner!r:.30}",
            lambda k=key, o=owner: client.get_or_reserve(k, owner=o),
            kinds=(dibs.ConfigurationError,),
            names=("owner",),
            key=str(key),
        )
        cases.count += 1
        if client.status(key).fence != 0:
            cases.violation("nothing overwritten", str(key), f"owner {owner!r:.30} was written")
    _printing(cases)


def _printing(cases: Cases) -> None:
    import contextlib
    import io

    from dibs.cli import main

    target, store = cases.run.target, cases.store
    client = cases.client("rel.print")
    key = Key("rel.print", "hostile-holder")
    got = client.get_or_reserve(key, owner="alice")
    assert isinstance(got, dibs.Acquired), got
    target.set_field(store, key, "owner", HOSTILE_OWNER)  # what dibs refuses, another writer may store
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    for command in (["ls"], ["show", key.name]):
        cases.count += 1
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = main([*command, "--store", target.url, "--namespace", "rel.print"])
            finally:  # main() configures logging for a process of its own: undo that here
                root.handlers[:], root.level = handlers, level
        printed = out.getvalue() + err.getvalue()
        raw = [ch for ch in ("\x1b", "\x07", "\u202e", "\r") if ch in printed]
        if raw or status != 0:
            cases.violation(
                "safe printing", str(key), f"dibs {command[0]} printed {raw!r} raw (status {status})"
            )


# -- the file store's special files (class 3) ----------------------------------------------------------------


def _special_files(cases: Cases) -> None:
    """A FIFO, a directory or a huge sparse file where a record belongs: nothing hangs, nothing is read
    whole, listing skips it; read directly it is a CorruptRecord."""
    if cases.run.target.name != "file":
        return
    store = cases.store
    client = cases.client("rel.special")
    client.run("good", cases.work(1))
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=4)

    def plant(kind: str, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "a FIFO":
            os.mkfifo(path)
        elif kind == "a directory":
            path.mkdir()
        else:
            with open(path, "wb") as file:
                file.truncate(2 * 1024**3)

    for kind in ("a FIFO", "a directory", "a sparse 2 GiB file"):
        key = Key("rel.special", f"record-{kind.split()[-1].lower()}")
        plant(kind, store.record_path(key))  # type: ignore[attr-defined]
        for action, call in (
            ("read", lambda k=key: client.status(k)),
            ("reserve", lambda k=key: client.get_or_reserve(k)),
            ("release", lambda k=key: client.force_release(k)),
            ("forget", lambda k=key: client.forget(k)),
        ):
            future = pool.submit(call)

            def wait(f: concurrent.futures.Future[Any] = future, a: str = action, k: str = kind) -> None:
                try:
                    f.result(timeout=_URL_TIMEOUT)
                except concurrent.futures.TimeoutError:
                    cases.violation("no hang", None, f"{a} of {k} in place of a record did not return")

            cases.expect_error(
                f"{action} of {kind} as a record", wait, kinds=(dibs.CorruptRecord,), key=str(key)
            )
        cases.count += 1
        listed = pool.submit(_list_and_reap, client)
        try:
            names, skipped = listed.result(timeout=_URL_TIMEOUT)
            if names != ["good"] or not any(key.digest in where for where in skipped):
                cases.violation("unreadable records skipped", str(key), f"ls with {kind}: {names}, {skipped}")
        except concurrent.futures.TimeoutError:
            cases.violation("no hang", None, f"ls with {kind} in place of a record did not return")
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}"
            cases.violation("unreadable records skipped", str(key), f"ls with {kind}: {why}")
        path = store.record_path(key)  # type: ignore[attr-defined]
        if kind == "a directory":
            path.rmdir()
        else:
            path.unlink()
    pool.shutdown(wait=False, cancel_futures=True)


def _list_and_reap(client: dibs.Reservations) -> tuple[list[str], list[str]]:
    """The names ``ls`` shows and where the records it skipped are; then a reap, which must not fail."""
    listing = client.list()
    names = [state.key.name for state in listing]
    client.reap()
    return names, [entry.where for entry in getattr(listing, "skipped", ())]
