"""The API documentation in a real headless Chromium with every request to another site
refused: /api/docs shows the API's operations, "Authorize" with an API key makes "Try it
out" answer 200, no Content-Security-Policy violation, and axe-core finds no serious or
critical violation on the first-session page and on the documentation's own parts.

Prerequisites as in test_respondent_browser.py (Debian's /usr/bin/chromium, axe-core from
``scripts/setup-browser``); the server is a real uvicorn on a small CES study.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.support.browser import DESKTOP, RESULTS, axe_violations
from tests.support.data import DATASETS_DIR, write_small_dataset
from tests.support.live_study import LiveStudy, make_live_study, uvicorn_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, LiveStudy]]:
    folder = tmp_path_factory.mktemp("docs-e2e")
    url = f"sqlite:///{folder / 'docs.db'}"
    live = make_live_study(url, write_small_dataset(DATASETS_DIR / "ces", folder / "ces", 120))
    try:
        with uvicorn_server(url, folder / "uvicorn.log") as base:
            yield base, live
    finally:
        live.engine.dispose()


@dataclass
class Visit:
    """A browser page whose requests to any other host are aborted and recorded
    (``offsite``), with its page errors and console errors or CSP reports (``problems``)."""

    page: Any
    offsite: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def route(self, host: str, r: Any) -> None:
        if urlsplit(r.request.url).netloc == host:
            r.continue_()
        else:
            self.offsite.append(r.request.url)
            r.abort()

    def console(self, msg: Any) -> None:
        if "Content Security Policy" in msg.text or msg.type == "error":
            self.problems.append(msg.text)


@pytest.fixture
def visit(browser: Any, server: tuple[str, LiveStudy]) -> Iterator[Visit]:
    host = urlsplit(server[0]).netloc
    context = browser.new_context(viewport=DESKTOP)
    v = Visit(context.new_page())
    v.page.route("**/*", lambda r: v.route(host, r))
    v.page.on("pageerror", lambda exc: v.problems.append(f"error: {exc}"))
    v.page.on("console", v.console)
    try:
        yield v
    finally:
        context.close()


def test_docs_show_the_operations_offline_and_authorize_works(
    visit: Visit, server: tuple[str, LiveStudy]
) -> None:
    base, live = server
    page = visit.page
    RESULTS.mkdir(parents=True, exist_ok=True)
    page.goto(f"{base}/api/docs")
    page.wait_for_selector(".opblock")
    page.screenshot(path=str(RESULTS / "api-docs.png"))
    paths = page.locator(".opblock-summary-path").all_inner_texts()
    for want in (
        "/api/v1/studies/{slug}/sessions",
        "/api/v1/sessions/{session_id}/answers",
        "/api/v1/studies",
        "/api/v1/studies/{slug}/responses",
        "/api/v1/studies/{slug}/predictions",
    ):
        assert any(p.replace("\u200b", "") == want for p in paths), (want, paths)
    # "Authorize" with the owner's API key, then "Try it out" on GET /api/v1/studies
    page.click("button.authorize")
    page.fill(".modal-ux input", live.owner_key)
    page.click(".modal-ux .auth-btn-wrapper button.authorize")
    page.click(".modal-ux button.btn-done")
    block = page.locator("#operations-results-list_studies_api_v1_studies_get")
    block.locator(".opblock-summary-control").click()
    block.locator("button.try-out__btn").click()
    block.locator("button.execute").click()
    status = block.locator(".live-responses-table tbody .response-col_status").first
    status.wait_for()
    assert status.inner_text().strip() == "200"
    assert f'"slug": "{live.slug}"' in block.locator(".live-responses-table").inner_text()
    # the key went as the bearer scheme (the operation has no Authorization field of its own)
    assert "Authorization: Bearer" in block.locator(".curl-command").inner_text()
    assert block.locator("input[placeholder='Authorization']").count() == 0
    block.scroll_into_view_if_needed()
    page.screenshot(path=str(RESULTS / "api-docs-try-it-out.png"))
    # axe on what this page adds around Swagger UI (its header and introduction)
    assert axe_violations(page) == []
    assert visit.offsite == []
    assert visit.problems == []


def test_first_session_page_offline_with_axe(visit: Visit, server: tuple[str, LiveStudy]) -> None:
    base, _live = server
    page = visit.page
    page.goto(f"{base}/api/docs")
    page.click("text=First session with curl")
    page.wait_for_selector("h1:has-text('A first session with curl')")
    code = page.locator("pre.walkthrough").inner_text()
    assert f"BASE={base}" in code and "api/v1/studies/$STUDY/sessions" in code
    assert axe_violations(page) == []
    page.screenshot(path=str(RESULTS / "api-first-session.png"), full_page=True)
    assert visit.offsite == []
    assert visit.problems == []
