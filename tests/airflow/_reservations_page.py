"""The Reservations page, as a person sees it: headless Chromium against the deployment's API server.

Used by tests/airflow/test_deployment.py while a key is held and its waiters are deferred. Chromium is
Debian's ``chromium`` package (scripts/install-chromium.sh), driven by Playwright with
``executable_path``: Playwright's own browser downloads are never used. Users come from Airflow's
simple auth manager: ``admin`` (may release a key) and ``viewer`` (reads only).
"""

from __future__ import annotations

import json
import os
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


def check_page(base: str, *, key: str, shots: Path) -> dict[str, Any]:
    """Open the page as ``admin`` and as ``viewer``; return what each saw (the caller asserts)."""
    from playwright.sync_api import sync_playwright

    seen: dict[str, Any] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), headless=True)
        try:
            for user in ("admin", "viewer"):
                context = browser.new_context(viewport={"width": 1400, "height": 520})
                context.add_cookies([{"name": "_token", "value": token(base, user), "url": base}])
                page = context.new_page()
                response = page.goto(f"{base}/dibs/?name={urllib.request.quote(key, safe='')}")
                row = page.locator(f'tr[data-key="{key}"]')
                seen[user] = {
                    "status": None if response is None else response.status,
                    "rows": row.count(),
                    "state": row.locator(".state").inner_text() if row.count() else None,
                    "holder": row.locator("td.holder").inner_text() if row.count() else None,
                    "holder_href": row.locator("td.holder a").first.get_attribute("href")
                    if row.count()
                    else None,
                    "waiters": row.locator("td.waiters li").all_inner_texts() if row.count() else [],
                    "release_buttons": row.get_by_text("Release…").count() if row.count() else 0,
                }
                if user == "admin":
                    shot = shots / "airflow-reservations.png"
                    page.screenshot(path=str(shot))
                    seen["screenshot"] = shot
                    if os.environ.get(SCREENSHOTS_ENV):
                        shutil.copy(shot, Path(os.environ[SCREENSHOTS_ENV]) / shot.name)
                else:
                    # What a viewer gets by going around the page: the confirmation page and the POST.
                    query = f"conn=dibs_default&namespace=e2e&key={urllib.request.quote(key, safe='')}"
                    confirm = page.goto(f"{base}/dibs/confirm?action=release&{query}")
                    seen[user]["confirm_status"] = None if confirm is None else confirm.status
                    seen[user]["confirm_text"] = page.locator("body").inner_text()
                    posted = context.request.post(
                        f"{base}/dibs/keys/release?{query}",
                        headers={"Origin": base},
                    )
                    seen[user]["post_status"] = posted.status
                context.close()
            anonymous = p.request.new_context()  # no session cookie: sent to Airflow's login
            response = anonymous.get(f"{base}/dibs/", max_redirects=0)
            seen["anonymous"] = (response.status, response.headers.get("location"))
            anonymous.dispose()
        finally:
            browser.close()
    return seen


def forget_through_page(base: str, *, key: str) -> dict[str, Any]:
    """As ``admin``: find the key, press "Forget…", read the confirmation, confirm; what was seen."""
    from playwright.sync_api import sync_playwright

    seen: dict[str, Any] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), headless=True)
        try:
            context = browser.new_context()
            context.add_cookies([{"name": "_token", "value": token(base, "admin"), "url": base}])
            page = context.new_page()
            page.goto(f"{base}/dibs/?state=done&name={urllib.request.quote(key, safe='')}")
            row = page.locator(f'tr[data-key="{key}"]')
            seen["state"] = row.locator(".state").inner_text()
            row.get_by_text("Forget…").click()
            seen["confirm"] = page.locator("h1").inner_text()
            # Around the form: a post with no Origin (no browser's form), and one that confirms a
            # holder the key no longer has (a stale confirmation page), change nothing.
            query = f"conn=dibs_default&namespace=e2e&key={urllib.request.quote(key, safe='')}"
            seen["no_origin"] = context.request.post(f"{base}/dibs/keys/forget?{query}").status
            seen["stale"] = context.request.post(
                f"{base}/dibs/keys/forget?{query}&token=999", headers={"Origin": base}
            ).status
            page.get_by_role("button", name="Forget this key").click()
            page.wait_for_load_state()
            seen["notice"] = page.get_by_role("status").inner_text()
            after = page.locator(f'tr[data-key="{key}"]')
            seen["after"] = [after.locator(".state").inner_text(), after.locator("td").nth(6).inner_text()]
            context.close()
        finally:
            browser.close()
    return seen
