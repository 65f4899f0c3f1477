"""What a snippet runs differently from what it shows, and why: the complete list.

The docs show the addresses of a deployment; the tests run the same code against real services of
the test machine. Each rule replaces text within one line, so the line numbers of a failure still
point into the Markdown file.

=====================================  ==========================================================
shown                                  run
=====================================  ==========================================================
``postgresql+psycopg://USER@HOST/DB``  ``$DIBS_TEST_POSTGRES_URL`` with a schema of its own for the
(any user, host, port and database)    document, dropped afterwards (skipped when the server is
                                       absent, a failure under ``DIBS_REQUIRE_SERVICES=1``)
``http://127.0.0.1:4200/api``          the session's Prefect test server (``prefect server start``
                                       listens on port 4200; the tests do not own that port)
``http://127.0.0.1:4318``              an OTLP/HTTP endpoint of the document's that keeps what it
                                       receives (tests/observability/otlp.py), standing where a
                                       collector listens (4318 is OTLP/HTTP's default port)
``sqlite:////tmp/NAME``                ``sqlite:///<the document's temporary directory>/NAME``
``file:///tmp/NAME``                   ``file://<the document's temporary directory>/NAME`` (a
                                       payload folder, docs/payloads.md)
``time.sleep(N)``                      ``time.sleep(0.5)``: the sleep stands for the expensive
                                       part of a demonstration, and only its length changes
=====================================  ==========================================================
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

POSTGRES_URL = re.compile(r"postgresql\+psycopg://[\w.-]+@[\w.-]+(?::\d+)?/\w+")
PREFECT_SERVER_API = "http://127.0.0.1:4200/api"
OTLP_ENDPOINT = "http://127.0.0.1:4318"
TMP_SQLITE_URL = re.compile(r"sqlite:////tmp/([\w.-]+)")
TMP_FILE_URL = re.compile(r"file:///tmp/([\w.-]+)")
SLEEP = re.compile(r"\btime\.sleep\(\s*\d+(?:\.\d+)?\s*\)")
DEMONSTRATION_SLEEP = "time.sleep(0.5)"


def substitute(
    source: str,
    *,
    postgres_url: Callable[[], str],
    prefect_api: Callable[[], str],
    otlp_endpoint: Callable[[], str],
    workdir: Path,
) -> str:
    """``source`` with the table's rules applied; the services are asked for only when named."""
    if OTLP_ENDPOINT in source:
        source = source.replace(OTLP_ENDPOINT, otlp_endpoint())
    if POSTGRES_URL.search(source):
        url = postgres_url()
        source = POSTGRES_URL.sub(lambda _: url, source)
    if PREFECT_SERVER_API in source:
        source = source.replace(PREFECT_SERVER_API, prefect_api())
    source = TMP_SQLITE_URL.sub(lambda match: f"sqlite:///{workdir / match.group(1)}", source)
    source = TMP_FILE_URL.sub(lambda match: (workdir / match.group(1)).as_uri(), source)
    return SLEEP.sub(DEMONSTRATION_SLEEP, source)
