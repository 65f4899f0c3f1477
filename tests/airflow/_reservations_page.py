"""The Reservations page, as a person sees it: headless Chromium against the deployment's API server.

Used by tests/airflow/test_deployment.py while a key is held and its waiters are deferred. Chromium is
Debian's ``chromium`` package (scripts/install-chromium.sh), driven by Playwright with
``executable_path``: Playwright's own browser downloads are never used. Users come from Airflow's
simple auth manager: ``admin`` (may release a key) and ``viewer`` (reads only).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import urllib.request
from pathlib import Path
from typing import Any

CHROMIUM_ENV = "DIBS_CHROMIUM"
#: Where the screenshot also goes when set (docs/ regenerates the documentation's pictures).
SCREENSHOTS_ENV = "DIBS_SCREENSHOTS"
PASSWORDS = {"admin": "dibs-e2e-admin", "viewer": "dibs-e2e-viewer"}


def chromium() -> str | None:
    """The Chromium binary, or ``None`` when it is not installed."""
    for candidate in (os.environ.get(CHROMIUM_ENV), "/usr/bin/chromium", "/usr/bin/chromium-browser"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("chromium")


def browser_missing() -> str | None:
    """Why the page cannot be checked here, or ``None`` when it can."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright is not installed (it is in the dev group: uv sync --group dev)"
    if chromium() is None:
        return f"Chromium is not installed (bash scripts/install-chromium.sh, or set {CHROMIUM_ENV})"
    return None


def auth_environment(home: Path) -> dict[str, str]:
    """Airflow settings for two users of the simple auth manager with known passwords."""
    passwords = home / "passwords.json"
    home.mkdir(parents=True, exist_ok=True)
    passwords.write_text(json.dumps(PASSWORDS))
    return {
        "AIRFLOW__CORE__AUTH_MANAGER": (
            "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
        ),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,viewer:viewer",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
    }


def token(base: str, user: str) -> str:
    """A JWT for ``user`` from the API server (``POST /auth/token``), as the UI's login gets one."""
    body = json.dumps({"username": user, "password": PASSWORDS[user]}).encode()
    request = urllib.request.Request(
        f"{base}/auth/token", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return str(json.load(response)["access_token"])


def api(base: str, jwt: str, path: str) -> Any:
    request = urllib.request.Request(f"{base}{path}", headers={"Authorization": f"Bearer {jwt}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def serving(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/api/v2/monitor/health", timeout=5):
            return True
    except OSError:
        return False


def add_connection(base: str, conn_id: str, spec: dict[str, Any]) -> None:
    body = json.dumps(
        {"connection_id": conn_id, "conn_type": spec["conn_type"], "extra": json.dumps(spec["extra"])}
    ).encode()
    request = urllib.request.Request(
        f"{base}/api/v2/connections",
        data=body,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token(base, 'admin')}"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 201, response.status


def _luminance(css_color: str) -> float:
    """0 (black) to 1 (white): the lightness a browser computed for a colour (``rgb(...)`` or
    ``oklch(...)``, as Chromium reports them)."""
    numbers = [float(n) for n in re.findall(r"[\d.]+", css_color)]
    if css_color.startswith("oklch"):
        return numbers[0]
    red, green, blue = numbers[:3]
    return (0.2126 * red + 0.7152 * green + 0.0722 * blue) / 255


def check_page(base: str, *, key: str, extra_link: str, shots: Path) -> dict[str, Any]:
    """Use the page as people do, as ``admin`` (light, then dark) and as ``viewer``; what each saw
    (the caller asserts).

    The admin goes Browse → Reservations in Airflow's UI, filters on the key inside the frame, and
    clicks its holder's task link; then follows the deferred task's "Reservation" extra link. In a
    dark browser, the page in Airflow's frame is read for its colours. Screenshots of both go to
    ``shots`` (and, with ``DIBS_SCREENSHOTS``, there too)."""
    from playwright.sync_api import sync_playwright

    seen: dict[str, Any] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), headless=True)
        try:
            seen["admin"] = _as_admin(browser, base, key=key, extra_link=extra_link, shots=shots)
            seen["dark"] = _in_the_dark(browser, base, key=key, extra_link=extra_link, shots=shots)
            seen["viewer"] = _as_viewer(browser, base, key=key)
            anonymous = p.request.new_context()  # no session cookie: sent to Airflow's login
            response = anonymous.get(f"{base}/dibs/", max_redirects=0)
            seen["anonymous"] = (response.status, response.headers.get("location"))
            anonymous.dispose()
        finally:
            browser.close()
    return seen


def _signed_in(browser: Any, base: str, user: str, **options: Any) -> Any:
    context = browser.new_context(viewport={"width": 1400, "height": 520}, **options)
    context.add_cookies([{"name": "_token", "value": token(base, user), "url": base}])
    return context


def _row(frame: Any, key: str) -> dict[str, Any]:
    """What the page shows of ``key``'s row (``frame``: the page, or Airflow's frame of it)."""
    row = frame.locator(f'tr[data-key="{key}"]')
    if not row.count():
        return {"rows": 0}
    holder = row.locator("td.holder a").first
    return {
        "rows": row.count(),
        "state": row.locator(".state").inner_text(),
        "holder": row.locator("td.holder").inner_text(),
        "holder_href": holder.get_attribute("href") if holder.count() else None,
        "waiters": row.locator("td.waiters li").all_inner_texts(),
        "release_buttons": row.get_by_text("Release…").count(),
    }


def _screenshot(page: Any, shots: Path, name: str) -> Path:
    shot = shots / name
    page.screenshot(path=str(shot))
    if os.environ.get(SCREENSHOTS_ENV):
        shutil.copy(shot, Path(os.environ[SCREENSHOTS_ENV]) / shot.name)
    return shot


def _as_admin(browser: Any, base: str, *, key: str, extra_link: str, shots: Path) -> dict[str, Any]:
    context = _signed_in(browser, base, "admin")
    page = context.new_page()
    page.goto(f"{base}/")
    page.get_by_role("button", name="Browse").click()
    page.get_by_role("menuitem", name="Reservations").click()
    page.wait_for_url("**/plugin/dibs**")
    frame = page.frame_locator("iframe")
    frame.get_by_placeholder("part of a key, or a glob").fill(key)  # Filter, inside Airflow's frame
    frame.get_by_role("button", name="Filter").click()
    frame.locator(f'tr[data-key="{key}"]').wait_for()
    page.wait_for_url(re.compile(r".*[?&]name="))  # Airflow's address bar follows the frame
    saw: dict[str, Any] = {"filtered_url": page.url, **_row(frame, key)}
    saw["screenshot"] = _screenshot(page, shots, "airflow-reservations.png")
    # The holder's task link opens the task in Airflow's own window: its page, one sidebar, no frame.
    frame.locator(f'tr[data-key="{key}"] td.holder a').first.click()
    page.wait_for_url("**/tasks/**")
    page.get_by_text("build_features").first.wait_for()
    saw["task_url"] = page.url
    saw["frames_after_click"] = page.locator("iframe").count()
    saw["sidebars_after_click"] = page.locator("nav").count()
    # A deferred task's "Reservation" link: the page, at its key, inside Airflow's frame.
    page.goto(f"{base}{extra_link}")
    page.frame_locator("iframe").locator(f'tr[data-key="{key}"]').wait_for()
    saw["linked_url"] = page.url
    saw["linked_frame"] = [frame.url for frame in page.frames[1:]]
    saw["linked_rows"] = page.frame_locator("iframe").locator("tr[data-key]").count()
    context.close()
    return saw


def _in_the_dark(browser: Any, base: str, *, key: str, extra_link: str, shots: Path) -> dict[str, Any]:
    """Airflow in dark mode (it follows the browser's), and the page in its frame."""
    context = _signed_in(browser, base, "admin", color_scheme="dark")
    page = context.new_page()
    page.goto(f"{base}{extra_link}")
    page.frame_locator("iframe").locator(f'tr[data-key="{key}"]').wait_for()
    (inner,) = page.frames[1:]
    airflow_dark = page.evaluate("() => document.documentElement.classList.contains('dark')")
    colours = inner.evaluate(
        "() => [getComputedStyle(document.documentElement).backgroundColor,"
        " getComputedStyle(document.body).color, document.documentElement.dataset.theme]"
    )
    saw = {
        "airflow_dark": airflow_dark,
        "theme": colours[2],
        "background": _luminance(colours[0]),
        "text": _luminance(colours[1]),
        "screenshot": _screenshot(page, shots, "airflow-reservations-dark.png"),
    }
    context.close()
    return saw


def _as_viewer(browser: Any, base: str, *, key: str) -> dict[str, Any]:
    context = _signed_in(browser, base, "viewer")
    page = context.new_page()
    response = page.goto(f"{base}/dibs/?name={urllib.request.quote(key, safe='')}")
    saw = {"status": None if response is None else response.status, **_row(page, key)}
    # What a viewer gets by going around the page: the confirmation page, a form's POST, and a
    # script's POST with the viewer's bearer token (no Origin: a token is no cross-site form's).
    query = f"conn=dibs_default&namespace=e2e&key={urllib.request.quote(key, safe='')}"
    confirm = page.goto(f"{base}/dibs/confirm?action=release&{query}")
    saw["confirm_status"] = None if confirm is None else confirm.status
    saw["confirm_text"] = page.locator("body").inner_text()
    saw["post_status"] = context.request.post(
        f"{base}/dibs/keys/release?{query}", headers={"Origin": base}
    ).status
    bearer = {"Authorization": f"Bearer {token(base, 'viewer')}"}
    saw["bearer_status"] = context.request.post(f"{base}/dibs/keys/release?{query}", headers=bearer).status
    context.close()
    return saw


def forget_through_page(base: str, *, key: str) -> dict[str, Any]:
    """As ``admin``, inside Airflow's frame: find the key, press "Forget…", read the confirmation,
    confirm; what was seen (the frame's page and Airflow's address bar after each step)."""
    from playwright.sync_api import sync_playwright

    seen: dict[str, Any] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), headless=True)
        try:
            context = _signed_in(browser, base, "admin")
            page = context.new_page()
            page.goto(f"{base}/plugin/dibs/dibs/?state=done&name={urllib.request.quote(key, safe='')}")
            frame = page.frame_locator("iframe")
            row = frame.locator(f'tr[data-key="{key}"]')
            seen["state"] = row.locator(".state").inner_text()
            row.get_by_text("Forget…").click()
            frame.get_by_role("button", name="Forget this key").wait_for()
            page.wait_for_url(re.compile(r".*/confirm\?"))  # the address bar follows the frame
            seen["confirm"] = frame.locator("h1").inner_text()
            seen["confirm_url"] = page.url
            # Around the form: a post with no Origin (no browser's form), and one that confirms a
            # holder the key no longer has (a stale confirmation page), change nothing; a script's
            # post with a bearer token needs no Origin (its stale token is what refuses it).
            query = f"conn=dibs_default&namespace=e2e&key={urllib.request.quote(key, safe='')}"
            seen["no_origin"] = context.request.post(f"{base}/dibs/keys/forget?{query}").status
            seen["stale"] = context.request.post(
                f"{base}/dibs/keys/forget?{query}&token=999", headers={"Origin": base}
            ).status
            bearer = {"Authorization": f"Bearer {token(base, 'admin')}"}
            seen["bearer_stale"] = context.request.post(
                f"{base}/dibs/keys/forget?{query}&token=999", headers=bearer
            ).status
            frame.get_by_role("button", name="Forget this key").click()
            seen["notice"] = frame.get_by_role("status").inner_text()
            page.wait_for_url(re.compile(r".*[?&]done="))
            seen["done_url"] = page.url
            after = frame.locator(f'tr[data-key="{key}"]')
            seen["after"] = [after.locator(".state").inner_text(), after.locator("td").nth(6).inner_text()]
            context.close()
        finally:
            browser.close()
    return seen
