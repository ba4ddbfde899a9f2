"""The respondent flow in a real headless Chromium (Debian's /usr/bin/chromium, driven by
Playwright's Python package; no browser download): a survey completed by keyboard alone,
screenshots at a phone width (390 px) and a desktop width, and axe-core accessibility
checks (no serious or critical violation) on the consent, question and completion pages.

Prerequisites are installed by ``scripts/setup-browser`` (apt chromium, npm axe-core),
which the fixture runs when something is missing. The server is a real uvicorn process on
a SQLite file prepared with a small CES study.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import DATASETS_DIR, REPO_ROOT, write_small_dataset
from live_study import free_port, make_live_study, wait_healthy

CHROMIUM = "/usr/bin/chromium"
AXE_JS = REPO_ROOT / "var" / "cache" / "npm" / "node_modules" / "axe-core" / "axe.min.js"
RESULTS = REPO_ROOT / "results" / "e2e"
LAUNCH_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
MAX_QUESTIONS = 4


@pytest.fixture(scope="module")
def browser_ready() -> None:
    if not (os.access(CHROMIUM, os.X_OK) and AXE_JS.is_file()):
        subprocess.run([str(REPO_ROOT / "scripts" / "setup-browser")], check=True)
    assert os.access(CHROMIUM, os.X_OK), "scripts/setup-browser did not install chromium"
    assert AXE_JS.is_file(), "scripts/setup-browser did not install axe-core"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A uvicorn process serving a prepared study; yields ``(base_url, slug)``."""
    folder = tmp_path_factory.mktemp("e2e")
    url = f"sqlite:///{folder / 'e2e.db'}"
    live = make_live_study(
        url,
        write_small_dataset(DATASETS_DIR / "ces", folder / "ces", 120),
        settings={"budgets": {"max_questions": MAX_QUESTIONS}},
    )
    live.engine.dispose()
    port = free_port()
    env = {**os.environ, "PRIORLY_DATABASE_URL": url, "PRIORLY_ENV": "dev"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "app.main:create_app",
            "--factory",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        cwd=REPO_ROOT,
        env=env,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc, "uvicorn", timeout=60)
        yield base, live.slug
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.fixture(scope="module")
def browser(browser_ready: None) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=LAUNCH_ARGS)
        yield b
        b.close()


def axe_violations(page: Any) -> list[dict[str, Any]]:
    """Serious or critical axe-core violations of the page as it is now."""
    # Evaluated through the browser's devtools channel: the page's Content-Security-Policy
    # (script-src 'self') refuses an injected inline <script>, as it should.
    page.evaluate(AXE_JS.read_text(encoding="utf-8"))
    result = page.evaluate("async () => await axe.run(document, {resultTypes: ['violations']})")
    return [
        {"id": v["id"], "impact": v["impact"], "nodes": [n["target"] for n in v["nodes"]][:5]}
        for v in result["violations"]
        if v.get("impact") in ("serious", "critical")
    ]


def tab_to(page: Any, predicate: str, limit: int = 25) -> None:
    """Press Tab until ``predicate`` (JS, on document.activeElement ``el``) holds."""
    for _ in range(limit):
        if page.evaluate(f"() => {{ const el = document.activeElement; return !!({predicate}); }}"):
            return
        page.keyboard.press("Tab")
    raise AssertionError(f"keyboard focus never reached: {predicate}")


@pytest.mark.parametrize(
    ("width", "height", "label"), [(390, 844, "phone-390"), (1280, 900, "desktop-1280")]
)
def test_survey_by_keyboard_with_screenshots_and_axe(
    server: tuple[str, str], browser: Any, width: int, height: int, label: str
) -> None:
    base, slug = server
    RESULTS.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(f"{base}/s/{slug}?PROLIFIC_PID=e2e-{label}")
        assert page.locator("h1").inner_text() == "Before you start"
        assert axe_violations(page) == []
        page.screenshot(path=str(RESULTS / f"consent-{label}.png"), full_page=True)
        # consent by keyboard: Tab to the accept button, Enter
        tab_to(page, "el && el.value === 'accept'")
        page.keyboard.press("Enter")
        page.wait_for_selector("text=A few questions about you")
        # attributes: answer the first one with Space, skip the rest, submit with Enter
        tab_to(page, "el && el.type === 'radio'")
        page.keyboard.press("Space")
        assert page.evaluate("() => document.activeElement.checked") is True
        page.keyboard.press("Enter")
        page.wait_for_selector("text=Question 1 of at most")
        assert axe_violations(page) == []
        page.screenshot(path=str(RESULTS / f"question-{label}.png"), full_page=True)
        for n in range(1, MAX_QUESTIONS + 1):
            page.wait_for_selector(f"text=Question {n} of at most {MAX_QUESTIONS}")
            tab_to(page, "el && el.type === 'radio'")
            page.keyboard.press("ArrowDown" if n % 2 else "Space")  # select an option
            assert page.evaluate("() => document.activeElement.checked") is True
            page.keyboard.press("Enter")  # submit (htmx swaps the next question in place)
        page.wait_for_selector("text=Thank you!")
        assert page.url.endswith(f"/s/{slug}/done")
        code = page.locator(".r-code").inner_text().strip()
        assert len(code) >= 6
        assert axe_violations(page) == []
        page.screenshot(path=str(RESULTS / f"done-{label}.png"), full_page=True)
        # no horizontal scrolling at this width
        assert page.evaluate("() => document.documentElement.scrollWidth") <= width
        assert errors == []
    finally:
        context.close()
