"""``dibs`` with a payload store: small outputs stay in the record, large ones are streamed into the
payload store; ``show`` names the payload, ``prune`` reports the bytes it freed."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli_harness import dibs, eventually, running
from tests.payloads.conftest import age, payload_files


def test_run_wait_show_and_prune_with_a_payload_store(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'dibs.db'}"
    payloads = (tmp_path / "payloads").as_uri()
    big = "head -c 300000 /dev/zero | tr '\\0' x"
    first = dibs("run", "--payloads", payloads, "--key", "big", "--", "sh", "-c", big, store=store)
    assert first.stdout == "x" * 300_000
    assert dibs("wait", "--payloads", payloads, "big", store=store).stdout == "x" * 300_000
    assert (
        dibs("run", "--payloads", payloads, "--key", "small", "--", "echo", "hi", store=store).stdout
        == "hi\n"
    )
    assert len(payload_files(tmp_path)) == 1  # only the large output

    shown = json.loads(dibs("show", "--json", "--payloads", payloads, "big", store=store).stdout)
    assert shown["artifact_size"] == 300_000
    assert payload_files(tmp_path)[0].as_uri().startswith(shown["artifact_payload"] + ".")  # <uri>.<stamp>

    # The environment variable works as the option does; --json says where a streamed output went.
    env = {"DIBS_PAYLOADS_URL": payloads, "DIBS_STORE_URL": store}
    envelope = json.loads(
        dibs("--json", "run", "--key", "other", "--", "sh", "-c", big + " | tr x y", env=env).stdout
    )
    assert envelope["encoding"] == "payload" and envelope["value"]["size"] == 300_000

    # A payload store's collection is younger-than-a-minute-proof: prune now removes the records only.
    pruned = json.loads(dibs("prune", "--json", "--older-than", "0s", env=env).stdout)
    assert pruned["pruned"] == 3 and pruned["payloads_removed"] == 0 and pruned["bytes_freed"] == 0
    assert len(payload_files(tmp_path)) == 2
    for path in payload_files(tmp_path):  # an hour later, as far as the payloads' times tell
        age(path, 3600)
    pruned = json.loads(dibs("prune", "--json", "--older-than", "0s", env=env).stdout)
    assert (pruned["payloads_removed"], pruned["bytes_freed"]) == (2, 600_000)
    assert payload_files(tmp_path) == []
    said = dibs("prune", "--older-than", "0s", env=env).stdout
    assert "removed 0 payload(s), 0 bytes freed" in said


def test_dibs_run_prints_a_waited_for_or_found_payload_as_it_reads_it(tmp_path: Path) -> None:
    # The waiter and the later hit print the stored stdout from the payload store (checked as it is
    # read), without loading it (test_memory measures that); a bad payload is never printed as good.
    store = f"sqlite:///{tmp_path / 'dibs.db'}"
    env = {"DIBS_PAYLOADS_URL": (tmp_path / "payloads").as_uri(), "DIBS_STORE_URL": store}
    started, go = tmp_path / "started", tmp_path / "go"
    make = f"touch {started}; while [ ! -e {go} ]; do sleep 0.02; done; head -c 300000 /dev/zero | tr '\\0' x"
    with running("run", "--key", "k", "--", "sh", "-c", make, env=env) as holder:
        eventually(started.exists, "the holder's command to start")
        with running("-v", "run", "--key", "k", "--", "false", env=env) as waiter:
            waiter.wait_for_line("is computing it")
            go.touch()
            assert [holder.finish(), waiter.finish()] == [0, 0]
    assert holder.stdout == waiter.stdout == b"x" * 300_000
    assert "waited" in waiter.stderr
    assert dibs("run", "--key", "k", "--", "false", env=env).stdout == "x" * 300_000  # a hit

    (stored,) = payload_files(tmp_path)
    stored.write_bytes(b"y" + stored.read_bytes()[1:])  # same size, other bytes: found only by reading
    # Checked before a byte is printed: a miss, so COMMAND computes it again; the bad bytes never show.
    again = dibs("run", "--key", "k", "--", "sh", "-c", "head -c 300000 /dev/zero | tr '\\0' y", env=env)
    assert again.stdout == "y" * 300_000 and "SHA-256" in again.stderr, again.stderr
    (fresh,) = [path for path in payload_files(tmp_path) if path.read_bytes()[:1] == b"y" and path != stored]
    fresh.write_bytes(b"y" * 10)  # truncated: a miss too
    again = dibs("run", "--key", "k", "--", "sh", "-c", "head -c 300000 /dev/zero | tr '\\0' z", env=env)
    assert again.stdout == "z" * 300_000


def test_json_names_a_streamed_payload_by_its_digest_function(tmp_path: Path) -> None:
    """``--json`` says where a streamed output went as its reference does: ``{"sha256": hex}`` by
    default, ``{"blake3": hex}`` for a folder store with ``?digest=blake3`` (not a BLAKE3 address under
    the key "sha256")."""
    store = f"sqlite:///{tmp_path / 'dibs.db'}"
    big = "head -c 300000 /dev/zero | tr '\\0' x"
    for query, named in (("", "sha256"), ("?digest=blake3", "blake3")):
        payloads = (tmp_path / f"payloads{named}").as_uri() + query
        envelope = json.loads(
            dibs(
                "--json", "run", "--payloads", payloads, "--key", named, "--", "sh", "-c", big, store=store
            ).stdout
        )
        assert envelope["encoding"] == "payload"
        value = envelope["value"]
        assert set(value) == {named, "size"} and value["size"] == 300_000
        assert len(value[named]) == 64 and int(value[named], 16) >= 0  # the bare hex digest
