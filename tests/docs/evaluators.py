"""How a ``python`` or ``bash`` block of the docs is run (Sybil evaluators)."""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from sybil import Example

from tests.docs.context import DocContext

SHELL_BOUND = 300.0  # seconds for one block's commands: only ever reached when something is broken
EXPECTED_STATUS = re.compile(r"#.*\bexits (\d+)\b")


def context(example: Example) -> DocContext:
    docs = example.namespace.get("docs")
    assert isinstance(docs, DocContext), "the docs fixture is missing: is the document listed in DOCUMENTS?"
    return docs


def visible(example: Example) -> bool:
    """A fenced block, as opposed to an invisible one (a directive inside an HTML comment)."""
    return "directive" not in example.region.lexemes


class PythonSnippet:
    """Executes the block in the document's namespace, after :mod:`~tests.docs.substitutions`."""

    def __call__(self, example: Example) -> None:
        __tracebackhide__ = True
        docs = context(example)
        docs.enter(example, shares_namespace=True)
        try:
            source = docs.substitute(str(example.parsed))
            # Blank lines first, so that tracebacks give the line of the Markdown file.
            padded = "\n" * (example.line + example.parsed.line_offset) + source
            code = compile(padded, example.path, "exec", dont_inherit=True)
            exec(code, example.namespace)
        except pytest.skip.Exception as skipped:  # an absent service: the blocks after this one skip too
            docs.skipped = str(skipped.msg)
            raise
        example.namespace.pop("__builtins__", None)
        if visible(example):
            docs.python_sources.append(source)


@dataclass(frozen=True)
class Command:
    line: int  # within the block, from 0
    text: str
    status: int  # the exit status it must end with: 0 unless its comment says "exits N"


def commands(source: str) -> Iterator[Command]:
    """The block's commands: a command goes on while a quote is open or a line ends with ``\\``."""
    lines = source.splitlines()
    start, pending = 0, False
    for number, line in enumerate(lines):
        if not pending:
            start = number
        text = "\n".join(lines[start : number + 1])
        try:
            words = shlex.split(text, comments=True)
        except ValueError:  # an open quote
            pending = True
            continue
        pending = line.rstrip().endswith("\\")
        if pending or not words:
            continue
        expected = EXPECTED_STATUS.search(line)
        yield Command(start, text, int(expected.group(1)) if expected else 0)
    assert not pending, f"the block ends inside a command: {lines[start]!r}"


def script(block: list[Command]) -> str:
    """Bash that runs the commands in one shell (``export`` carries over) and stops at the first one
    that does not end as it should, naming it."""
    parts = [
        "set -o pipefail",
        'check() { if [ "$1" -ne "$2" ]; then echo "[snippet: command $3 exited $1]" >&2; exit 97; fi; }',
    ]
    for index, command in enumerate(block):
        parts += [command.text, f"check $? {command.status} {index}"]
    return "\n".join(parts) + "\n"


class ShellSnippet:
    """Runs the block's commands in ``bash``, in the document's directory and environment."""

    def __call__(self, example: Example) -> None:
        __tracebackhide__ = True
        docs = context(example)
        docs.enter(example, shares_namespace=False)
        block = list(commands(docs.substitute(str(example.parsed))))
        env = docs.shell_env()
        done = subprocess.run(
            ["bash", "-c", script(block)],
            cwd=docs.workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=SHELL_BOUND,
            check=False,
        )
        failed = re.search(r"\[snippet: command (\d+) exited (\d+)\]", done.stdout)
        if failed:
            command = block[int(failed.group(1))]
            where = example.line + example.parsed.line_offset + command.line + 1
            pytest.fail(
                f"{example.path}:{where}: `{command.text}` exited {failed.group(2)}, "
                f"expected {command.status}; output:\n{done.stdout[-4000:]}",
                pytrace=False,
            )
        if done.returncode != 0:
            pytest.fail(f"the block's shell exited {done.returncode}:\n{done.stdout[-4000:]}", pytrace=False)
