"""The survey pages when something goes wrong, in a real headless Chromium (Debian's
/usr/bin/chromium through Playwright): an answer that cannot be sent (offline, 500, 429)
keeps the choice and says what to do, and a retry that goes through clears the message;
the study closed mid-survey shows its page; the cookie lost mid-survey leads to the start
page saying so (one page, not a page inside the survey card); during a slow submit the
options stay as sent and "Saving…" is shown; the focus starts on the question, never on
an option, and hovering colours no option on a touch screen. The server is a real
uvicorn process on a SQLite file prepared with a small CES study. Screenshots at 390 px
go to docs/screenshots/respondent/.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.browser import PHONE, RESULTS, SCREENSHOTS, axe_violations, shot
from tests.support.data import DATASETS_DIR, write_small_dataset
from tests.support.live_study import make_live_study, uvicorn_server

SHOTS = SCREENSHOTS / "respondent"
N_ATTRIBUTES = 9  # the CES study's questions about the respondent, skipped here


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str]]:
    """A uvicorn process serving a prepared study; yields ``(base_url, slug, database_url)``."""
    folder = tmp_path_factory.mktemp("e2e-fail")
    url = f"sqlite:///{folder / 'e2e.db'}"
    live = make_live_study(
        url,
        write_small_dataset(DATASETS_DIR / "ces", folder / "ces", 120),
        settings={"budgets": {"max_questions": 4}},
    )
    live.engine.dispose()
    with uvicorn_server(url, folder / "uvicorn.log", timeout=60) as base:
        yield base, live.slug, url


def _sql(db_url: str, sql: str, **params: Any) -> Any:
    """The first column of the first row of ``sql`` on the server's database (committed)."""
    from sqlalchemy import create_engine, text

    eng = create_engine(db_url)
    try:
        with eng.begin() as conn:
            result = conn.execute(text(sql), params)
            return result.scalar() if result.returns_rows else None
    finally:
        eng.dispose()


def first_question(browser: Any, base: str, slug: str) -> tuple[Any, Any]:
    """A new phone-sized context and its page at the first adaptive question (consent, and
    the questions about the respondent skipped)."""
    context = browser.new_context(viewport=PHONE)
    page = context.new_page()
    page.goto(f"{base}/s/{slug}")
    page.click("button[value=accept]")
    page.wait_for_selector("text=A few questions about you")
    page.click("button.r-primary")
    page.click("button[name=skip_all]")
    page.wait_for_selector(f"text=Question {N_ATTRIBUTES + 1} of at most")
    return context, page


def _alert(page: Any) -> str:
    """The text of the form's send-error alert once it is shown."""
    page.wait_for_selector("#survey [data-send-error]:not([hidden])")
    return str(page.locator("#survey [data-send-error]").inner_text())


def test_a_failed_send_keeps_the_choice_says_why_and_a_retry_clears_it(
    server: tuple[str, str, str], browser: Any
) -> None:
    base, slug, db_url = server
    context, page = first_question(browser, base, slug)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        answer = f"**/s/{slug}/answer"
        key = page.locator("input[name=idempotency_key]").get_attribute("value")
        page.check("input[name=option] >> nth=1")
        chosen = page.locator("input[name=option] >> nth=1").get_attribute("value")
        failures = [
            (
                lambda route: route.abort("internetdisconnected"),
                "Your answer could not be sent. Check your connection and press Next again.",
            ),
            (
                lambda route: route.fulfill(status=500, body="Internal Server Error"),
                "Something went wrong on our side; your answer was not saved. "
                "Please press Next again.",
            ),
            (
                lambda route: route.fulfill(
                    status=429,
                    headers={"Retry-After": "7"},
                    content_type="text/html",
                    body="<!doctype html><title>Please wait a moment</title><main>…</main>",
                ),
                "Too many answers from your network just now: please wait 7 seconds and press "
                "Next again.",
            ),
        ]
        for n, (handler, message) in enumerate(failures):
            page.route(answer, handler)
            page.click("button.r-primary")
            assert _alert(page) == message
            page.unroute(answer)
            # nothing swapped: the choice kept, the form usable again, "Saving…" gone
            assert page.locator("input[name=option] >> nth=1").is_checked()
            assert page.locator("#survey form").get_attribute("aria-busy") is None
            assert page.locator("button.r-primary").is_enabled()
            assert page.locator("#survey [data-send-status]").inner_text() == ""
            assert page.locator("main").count() == 1
            if n == 0:
                assert axe_violations(page) == []
                shot(page, SHOTS, "send-error-390")
        assert _sql(db_url, "SELECT count(*) FROM answer WHERE idempotency_key = :k", k=key) == 0
        # the retry goes through: the next question, no message; the answer is the choice
        page.click("button.r-primary")
        page.wait_for_selector(f"text=Question {N_ATTRIBUTES + 2} of at most")
        assert page.locator("#survey [data-send-error]").is_hidden()
        assert page.locator("#survey [data-send-error]").inner_text() == ""
        assert _sql(db_url, "SELECT option FROM answer WHERE idempotency_key = :k", k=key) == chosen
        assert errors == []
    finally:
        context.close()


def test_the_study_closed_mid_survey_shows_its_page(
    server: tuple[str, str, str], browser: Any
) -> None:
    """The answer is refused with the "not available" page (404): that page is shown, once
    (one header, one main), with its title; not a silent Next."""
    base, slug, db_url = server
    context, page = first_question(browser, base, slug)
    close = "UPDATE study SET status = :s WHERE slug = :slug"
    try:
        page.check("input[name=option] >> nth=0")
        _sql(db_url, close, s="closed", slug=slug)
        try:
            page.click("button.r-primary")
            page.wait_for_selector("h1:text('Survey not available')")
        finally:
            _sql(db_url, close, s="published", slug=slug)
        assert page.locator("main").count() == 1 and page.locator("header").count() == 1
        assert "does not exist or is not open" in page.inner_text("main")
        assert page.title() == "Survey not available"
        assert page.evaluate("() => document.activeElement.tagName") == "H1"
        assert axe_violations(page) == []
    finally:
        context.close()


def test_the_cookie_lost_mid_survey_leads_to_the_start_page_saying_so(
    server: tuple[str, str, str], browser: Any
) -> None:
    base, slug, _ = server
    context, page = first_question(browser, base, slug)
    try:
        page.check("input[name=option] >> nth=0")
        context.clear_cookies(name=re.compile(r"priorly_s\d+"))  # the session cookie
        page.click("button.r-primary")
        page.wait_for_selector("text=This browser no longer has your answers")
        assert page.url.endswith(f"/s/{slug}?priorly_lost=1")
        # a page of its own, not the consent page inside the survey card
        assert page.locator("main").count() == 1 and page.locator("header").count() == 1
        assert page.locator("h1").inner_text() == "Before you start"
        assert "resume link" in page.inner_text("main")
        assert axe_violations(page) == []
        shot(page, SHOTS, "lost-session-390")
    finally:
        context.close()


def test_during_a_slow_submit_the_choice_stays_as_sent(
    server: tuple[str, str, str], browser: Any
) -> None:
    """While the answer is on its way the options take no click or key, the form is
    aria-busy and says "Saving…"; the inputs are not disabled (so they were sent), and what
    is stored is what the page still shows."""
    base, slug, db_url = server
    context, page = first_question(browser, base, slug)
    held: list[Any] = []
    try:
        key = page.locator("input[name=idempotency_key]").get_attribute("value")
        page.route(f"**/s/{slug}/answer", lambda route: held.append(route))
        page.check("input[name=option] >> nth=0")
        page.click("button.r-primary")
        page.wait_for_selector("#survey form[aria-busy=true]")
        assert page.locator("#survey [data-send-status]").inner_text() == "Saving…"
        shot(page, RESULTS, "saving-390")
        # both buttons: "Prefer not to answer" would queue a second answer to this question
        assert page.locator("button.r-primary").is_disabled()
        assert page.locator("button.r-secondary").is_disabled()
        assert page.evaluate(
            "() => [...document.querySelectorAll('input[name=option]')].every(e => !e.disabled)"
        )
        # another choice by click, by tap on its label, by keyboard: none takes
        page.evaluate("() => document.querySelectorAll('input[name=option]')[1].click()")
        page.evaluate("() => document.querySelectorAll('.r-option')[1].click()")
        page.focus("input[name=option] >> nth=0")
        page.keyboard.press("ArrowDown")
        page.keyboard.press("Space")
        assert page.locator("input[name=option] >> nth=0").is_checked()
        assert not page.locator("input[name=option] >> nth=1").is_checked()
        assert held, "the answer was sent"
        sent = held[0].request.post_data or ""
        first = page.locator("input[name=option] >> nth=0").get_attribute("value")
        assert f"option={first}" in sent
        held[0].continue_()
        page.wait_for_selector(f"text=Question {N_ATTRIBUTES + 2} of at most")
        assert page.locator("#survey [data-send-status]").inner_text() == ""
        assert page.locator("button.r-secondary").is_enabled()
        assert _sql(db_url, "SELECT option FROM answer WHERE idempotency_key = :k", k=key) == first
    finally:
        context.close()


FOCUSED_OPTION = "() => document.querySelector('.r-option:has(input:focus)') !== null"


def test_the_focus_starts_on_the_question_and_no_option_looks_chosen(
    server: tuple[str, str, str], browser: Any
) -> None:
    """On a full load and after each htmx swap the focus is on the question's heading (no
    ring around option A); Tab reaches option A, the arrow keys move between options. On a
    screen without hover (touch) hovering colours no option."""
    base, slug, _ = server
    context, page = first_question(browser, base, slug)
    heading = "() => document.activeElement === document.querySelector('#survey h1.r-qtext')"
    try:
        page.wait_for_function(heading)  # after the swap of the skipped questions about you
        assert not page.evaluate(FOCUSED_OPTION)
        page.reload()
        page.wait_for_function(heading)  # the full page
        assert not page.evaluate(FOCUSED_OPTION)
        shot(page, SHOTS, "question-390")
        page.keyboard.press("Tab")
        assert page.evaluate(
            "() => document.activeElement === document.querySelector('input[name=option]')"
        )
        page.keyboard.press("ArrowDown")
        assert page.locator("input[name=option] >> nth=1").is_checked()
        page.keyboard.press("Enter")
        page.wait_for_selector(f"text=Question {N_ATTRIBUTES + 2} of at most")
        page.wait_for_function(heading)
        assert not page.evaluate(FOCUSED_OPTION)
        # hover: the accent border with a mouse; none on a touch screen (hover: none),
        # where a tap leaves the hover state on whatever was under the finger
        for touch in (False, True):
            other = browser.new_context(viewport=PHONE, has_touch=touch, is_mobile=touch)
            try:
                other.add_cookies(context.cookies())
                tab = other.new_page()
                tab.goto(f"{base}/s/{slug}/q")
                assert tab.evaluate("() => matchMedia('(hover: none)').matches") is touch
                option = tab.locator(".r-option >> nth=1")
                line = option.evaluate("e => getComputedStyle(e).borderTopColor")
                option.hover()
                colour = option.evaluate("e => getComputedStyle(e).borderTopColor")
                assert (colour == line) is touch, (touch, colour, line)
            finally:
                other.close()
    finally:
        context.close()
