"""stderr, shared by everything the command says: a live status line for people, events for logs.

stdout carries only results (the artifact, a table, a JSON document); everything else goes here.

* **A terminal** (stderr is a TTY and ``TERM`` is not ``dumb``): one live status line, redrawn in
  place while ``dibs`` waits, with the notable events (a takeover, a failure, the end of a wait)
  printed above it as lines that stay. ``-v`` adds every event and dibs's own log.
* **Anything else** (a pipe, a file, CI): nothing unless ``-v``; then one line per event, never a
  redrawn line. With ``--json`` each of those lines is a JSON object.
* **Warnings and errors** are always shown, each once: a message that repeats one already shown (a
  heartbeat retrying against a store that is down, the error that ends the command after dibs
  logged it) is not printed again.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
from typing import Any, TextIO

from dibs.display import printable

__all__ = ["Console"]

_ERASE_LINE = "\r\x1b[2K"
#: A repeat is recognized whole, or as a part of an earlier message of at least this length.
_SAME_MESSAGE_MIN = 24


class Console:
    def __init__(self, stream: TextIO, *, verbose: int = 0, json_lines: bool = False) -> None:
        self.stream = stream
        self.verbose = verbose
        self.live = _is_terminal(stream) and os.environ.get("TERM") != "dumb"
        self.json_lines = json_lines and not self.live
        self._lock = threading.RLock()
        self._status_parts: tuple[str, ...] = ()
        self._said: list[str] = []

    @property
    def watching(self) -> bool:
        """Whether anybody follows a wait: a person at a terminal, or ``-v``."""
        return self.live or self.verbose > 0

    # -- the live line ---------------------------------------------------------------------------
    def status(self, *parts: str) -> None:
        """Show the live status line (on a terminal only): as many of ``parts`` as fit, in order of
        importance (the first always), joined with `` · ``."""
        if not self.live:
            return
        with self._lock:
            self._status_parts = parts
            self._draw()

    def clear_status(self) -> None:
        if not self.live:
            return
        with self._lock:
            if self._status_parts:
                self._write(_ERASE_LINE)
            self._status_parts = ()

    # -- lines that stay -------------------------------------------------------------------------
    def event(self, kind: str, text: str, *, notable: bool = False, **fields: Any) -> None:
        """Something happened. ``notable`` events show on a terminal without ``-v``."""
        if self.live:
            if notable or self.verbose:
                self._line(f"dibs: {text}")
        elif self.verbose:
            self._line(self._json(kind, text, fields) if self.json_lines else f"dibs: {text}")

    def say(self, kind: str, text: str, **fields: Any) -> None:
        """Something everyone must hear about, ``-v`` or not (a stop that changed the key's state)."""
        self._line(self._json(kind, text, fields) if self.json_lines else f"dibs: {text}")

    def problem(self, level: str, text: str, **fields: Any) -> None:
        """A warning or an error (``level``): always shown, but only once."""
        with self._lock:
            if self._already_said(text):
                return
            self._said.append(text)
            self._line(self._json(level, text, fields) if self.json_lines else f"dibs: {level}: {text}")

    def log_handler(self) -> logging.Handler:
        """A handler for the ``dibs`` logger that speaks through this console."""
        return _ConsoleHandler(self)

    # -- plumbing --------------------------------------------------------------------------------
    def _already_said(self, text: str) -> bool:
        for said in self._said:
            if text == said:
                return True
            if len(text) >= _SAME_MESSAGE_MIN and text in said:
                return True
            if len(said) >= _SAME_MESSAGE_MIN and said in text:
                return True
        return False

    def _line(self, text: str) -> None:
        # Messages quote holders and foreign records: escape what a terminal would act on (JSON lines
        # are escaped by json.dumps already; a traceback keeps its lines).
        text = "\n".join(printable(line) for line in text.split("\n"))
        with self._lock:
            if self._status_parts:
                self._write(_ERASE_LINE)
            self._write(text + "\n")
            if self._status_parts:
                self._draw()

    def _draw(self) -> None:
        width = shutil.get_terminal_size((80, 24)).columns - 1
        first, *rest = (printable(part) for part in self._status_parts)
        line = _fit(first, width)
        for part in rest:
            if len(line) + 3 + len(part) <= width:
                line += " · " + part
        self._write(_ERASE_LINE + line)

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # stderr closed or gone: nothing else to tell anyone
            pass

    @staticmethod
    def _json(kind: str, text: str, fields: dict[str, Any]) -> str:
        return json.dumps({"event": kind, "message": text, **fields}, default=str)


class _ConsoleHandler(logging.Handler):
    def __init__(self, console: Console) -> None:
        super().__init__()
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:
            self.handleError(record)
            return
        if record.levelno >= logging.ERROR:
            self.console.problem("error", text)
        elif record.levelno >= logging.WARNING:
            self.console.problem("warning", text)
        else:
            self.console.event("log", text, level=record.levelname.lower())


def _fit(text: str, width: int) -> str:
    """``text`` in ``width`` columns, shortened at a word boundary with an ellipsis if it must be."""
    if len(text) <= width:
        return text
    cut = text[: max(0, width - 1)]
    if " " in cut:
        cut = cut[: cut.rindex(" ")]
    return cut.rstrip(" ·,;:") + "…"


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
