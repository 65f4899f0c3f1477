"""Fuzzing :func:`dibs.stores.redact_url`, the one way dibs shows a store URL (issue 16, item 10).

The secrets are drawn from upper-case letters and the characters that cut a URL short when pasted
unencoded (``@ & # / ? : = %``); everything else in the URLs is lower case. So the assertion is strict:
no upper-case letter may survive redaction, which catches a leaked tail or head of a secret, not only
the secret whole (a Redis ``?password=`` holding ``@`` or ``&`` once leaked its tail).
"""

from __future__ import annotations

import re
import urllib.parse

from hypothesis import example, given, settings
from hypothesis import strategies as st

from dibs.stores import STORE_SCHEMES, hide_secrets, redact_url, url_secrets

SCHEMES = sorted({*STORE_SCHEMES, "postgresql+psycopg", "mysql+pymysql", "https"})
SECRET_PARAMS = ["password", "passwd", "pwd", "secret", "sas_token", "sig", "account_key", "token"]

secrets = st.text(alphabet="ABCDEFGHKLMNPQRSTUVWXYZ@&#/?:=%", min_size=1, max_size=24).filter(
    lambda s: any(c.isupper() for c in s)
)
words = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=8)
hosts = st.sampled_from(["db", "127.0.0.1", "cache.internal", "a.blob.core.windows.net", ""])
ports = st.sampled_from(["", ":5432", ":6379"])
paths = st.sampled_from(["", "/0", "/dibs", "/c/prefix"])
others = st.sampled_from(["", "prefix=dibs", "timeout=3", "db=1", "application_name=x"])
how = st.sampled_from(["raw", "quoted"])


def encoded(secret: str, form: str) -> str:
    return urllib.parse.quote(secret, safe="") if form == "quoted" else secret


def assert_hidden(url: str, secret: str) -> None:
    shown = redact_url(url)
    assert not any(c.isupper() for c in shown), (url, shown)
    for form in (secret, urllib.parse.quote(secret, safe=""), urllib.parse.unquote(secret)):
        assert len(form) < 2 or form not in shown, (url, shown)


@st.composite
def user_password_urls(draw: st.DrawFn) -> tuple[str, str]:
    """``scheme://user:SECRET@host[:port][/path][?option]``, the secret raw or percent-encoded."""
    scheme, user, secret = draw(st.sampled_from(SCHEMES)), draw(words | st.just("")), draw(secrets)
    host, port, path, other = draw(hosts), draw(ports), draw(paths), draw(others)
    query = f"?{other}" if other else ""
    return f"{scheme}://{user}:{encoded(secret, draw(how))}@{host}{port}{path}{query}", secret


@st.composite
def query_secret_urls(draw: st.DrawFn) -> tuple[str, str]:
    """``scheme://host[:port][/path]?[option&]NAME=SECRET[&option]``, raw or percent-encoded."""
    scheme, host, port, path = draw(st.sampled_from(SCHEMES)), draw(hosts), draw(ports), draw(paths)
    name, secret = draw(st.sampled_from(SECRET_PARAMS)), draw(secrets)
    before, after = draw(others), draw(others)
    params = [p for p in (before, f"{name}={encoded(secret, draw(how))}", after) if p]
    return f"{scheme}://{host}{port}{path}?{'&'.join(params)}", secret


@settings(max_examples=400, deadline=None)
@given(user_password_urls())
@example(("redis://u:A://B@cache/0", "A://B"))
@example(("postgresql+psycopg://u:X?Y=A://B@db/x", "X?Y=A://B"))
def test_a_user_password_is_hidden_in_every_scheme(case: tuple[str, str]) -> None:
    assert_hidden(*case)


@settings(max_examples=400, deadline=None)
@given(query_secret_urls())
@example(("redis://cache:6379/0?password=AB@CD&db=1", "AB@CD"))
@example(("redis://cache:6379/0?password=AB&CD&db=1", "AB&CD"))
def test_a_query_secret_is_hidden_whatever_it_holds(case: tuple[str, str]) -> None:
    assert_hidden(*case)


@settings(max_examples=200, deadline=None)
@given(words, secrets, others, st.sampled_from(["raw", "quoted"]))
def test_the_password_of_a_url_nested_in_a_query_value_is_hidden(
    user: str, secret: str, after: str, how: str
) -> None:
    tail = f"&{after}" if after else ""
    url = f"azure://container?account_url=https://{user}:{encoded(secret, how)}@a.blob.core.windows.net{tail}"
    assert_hidden(url, secret)


@settings(max_examples=200, deadline=None)
@given(words, secrets, others, how)
@example("dibs", "AB@CD&EF", "", "raw")
@example("a", "A/", "", "raw")
def test_the_password_of_a_percent_encoded_url_nested_in_a_query_value_is_hidden(
    user: str, secret: str, after: str, how: str
) -> None:
    """``?listen_url=`` as SQLAlchemy writes a URL in a URL (issue 29): the nested URL percent-encoded,
    its password encoded once more, or pasted raw before the whole was encoded."""
    nested = f"postgresql://{user}:{encoded(secret, how)}@db-primary:5432/pipelines"
    tail = f"&{after}" if after else ""
    listen_url = urllib.parse.quote(nested, safe="")
    url = f"postgresql+psycopg://{user}:pw@pooler:6432/pipelines?listen_url={listen_url}{tail}"
    shown = redact_url(url)
    # The percent-escapes are upper case themselves: every letter but theirs must be lower case. The
    # secret's encoded forms are looked for in the text decoded (once and twice), not in the escapes,
    # where "A%2F" (the secret "A/" encoded) stands inside "%3A%2F" (":/" encoded) with no secret shown.
    assert not any(c.isupper() for c in re.sub(r"%[0-9A-F]{2}", "", shown)), (url, shown)
    once = urllib.parse.unquote(shown)
    for text in (once, urllib.parse.unquote(once)):
        assert not any(c.isupper() for c in re.sub(r"%[0-9A-F]{2}", "", text)), (url, shown)
        assert len(secret) < 2 or secret not in text, (url, shown)
    if len(secret) >= 4:
        message = f"connection to db-primary failed for {secret}"
        assert secret not in hide_secrets(message, url_secrets(url))


@settings(max_examples=200, deadline=None)
@given(words, secrets.filter(lambda s: not s.startswith("//")), hosts)
@example("0", "//A", "db")  # "0://A@db/db": a digit cannot start a scheme, so this is user "0", not a URL
def test_text_without_a_scheme_is_redacted_too(user: str, secret: str, host: str) -> None:
    # (A secret starting with "//" would make "user://..." a URL whose user part is the secret's tail:
    # "abc://A@db" names user "A", which is no secret.)
    assert_hidden(f"{user}:{secret}@{host}/db", secret)
    assert_hidden(f"redis:/:{secret}@{host}", secret)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(SCHEMES), words, secrets, how)
def test_a_driver_message_quoting_a_secret_is_scrubbed(
    scheme: str, user: str, secret: str, form: str
) -> None:
    url = f"{scheme}://{user}:{encoded(secret, form)}@db/x?password={encoded(secret, form)}"
    message = f"could not connect as {user} with {secret!s} / {urllib.parse.quote(secret, safe='')}"
    scrubbed = hide_secrets(message, url_secrets(url))
    if len(secret) >= 4:
        assert secret not in scrubbed and urllib.parse.quote(secret, safe="") not in scrubbed, scrubbed
