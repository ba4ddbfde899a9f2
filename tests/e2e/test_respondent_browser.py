"""The respondent flow in a real headless Chromium (Debian's /usr/bin/chromium, driven by
Playwright's Python package; no browser download): a survey completed by keyboard alone,
screenshots at a phone width (390 px) and a desktop width, and axe-core accessibility
checks (no serious or critical violation) on every respondent page: consent, the pages of
questions about the respondent (and their "skip them all?" prompt), question, completion
with "what we learned about you", the declined page after answers, the deletion page.
The Back button after consent, or a consent page left open in another tab after finishing,
never starts a second respondent. Screenshots of the pages at 390x844 go to
docs/screenshots/respondent/.

Prerequisites are installed by ``scripts/setup-browser`` (apt chromium, npm axe-core),
which the fixture runs when something is missing. The server is a real uvicorn process on
a SQLite file prepared with a small CES study.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.browser import DESKTOP, PHONE, RESULTS, SCREENSHOTS, axe_violations, log_in, shot
from tests.support.data import DATASETS_DIR, write_small_dataset
from tests.support.live_study import make_live_study, uvicorn_server

SHOTS = SCREENSHOTS / "respondent"
MAX_QUESTIONS = 4


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str]]:
    """A uvicorn process serving a prepared study (with "what we learned about you" on);
    yields ``(base_url, slug, database_url)``."""
    folder = tmp_path_factory.mktemp("e2e")
    url = f"sqlite:///{folder / 'e2e.db'}"
    live = make_live_study(
        url,
        write_small_dataset(DATASETS_DIR / "ces", folder / "ces", 120),
        settings={"budgets": {"max_questions": MAX_QUESTIONS}, "show_learned": True},
    )
    live.engine.dispose()
    with uvicorn_server(url, folder / "uvicorn.log", timeout=60) as base:
        yield base, live.slug, url


def tab_to(page: Any, predicate: str, limit: int = 25) -> None:
    """Press Tab until ``predicate`` (JS, on document.activeElement ``el``) holds."""
    for _ in range(limit):
        if page.evaluate(f"() => {{ const el = document.activeElement; return !!({predicate}); }}"):
            return
        page.keyboard.press("Tab")
    raise AssertionError(f"keyboard focus never reached: {predicate}")


def _csv(response: Any) -> list[dict[str, str]]:
    """The rows of a CSV download (UTF-8 with a BOM)."""
    assert response.status == 200, response.status
    return list(csv.DictReader(io.StringIO(response.body().decode("utf-8-sig"))))


def live_respondents(db_url: str) -> int:
    """Live respondents stored in the server's database."""
    return _count(db_url, "SELECT count(*) FROM respondent WHERE source = 'live'")


def erasure_records(db_url: str) -> int:
    """Erasure records (one per erased respondent) in the server's database."""
    return _count(db_url, "SELECT count(*) FROM erasure_record")


def _count(db_url: str, sql: str) -> int:
    from sqlalchemy import create_engine, text

    eng = create_engine(db_url)
    try:
        with eng.connect() as conn:
            return int(conn.execute(text(sql)).scalar())
    finally:
        eng.dispose()


N_ATTRIBUTES = 9  # the CES study's questions about the respondent (3 pages of 3)


@pytest.mark.parametrize(
    ("width", "height", "label"), [(390, 844, "phone-390"), (1280, 900, "desktop-1280")]
)
def test_survey_by_keyboard_with_screenshots_and_axe(
    server: tuple[str, str, str], browser: Any, width: int, height: int, label: str
) -> None:
    base, slug, _ = server
    total = N_ATTRIBUTES + MAX_QUESTIONS
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(f"{base}/s/{slug}?PROLIFIC_PID=e2e-{label}")
        assert page.locator("h1").inner_text() == "Before you start"
        assert axe_violations(page) == []
        shot(page, RESULTS, f"consent-{label}")
        # consent by keyboard: Tab to the accept button, Enter
        tab_to(page, "el && el.value === 'accept'")
        page.keyboard.press("Enter")
        page.wait_for_selector("text=A few questions about you")
        # questions about you, three per page: answer the first of each page with Space
        for first, last in ((1, 3), (4, 6), (7, 9)):
            page.wait_for_selector(f"text=Questions {first} to {last} of at most {total}")
            assert page.locator("fieldset.r-question").count() == last - first + 1
            if first == 1:
                assert axe_violations(page) == []
                shot(page, RESULTS, f"about-{label}")
                if width == PHONE["width"]:
                    shot(page, SHOTS, "about-page-1-390")
            # the focus moves to the page's first question (autofocus) once htmx settles
            page.wait_for_function(
                "() => document.activeElement && document.activeElement.matches('legend.r-legend')"
            )
            tab_to(page, "el && el.type === 'radio'")
            page.keyboard.press("Space")
            assert page.evaluate("() => document.activeElement.checked") is True
            page.keyboard.press("Enter")
            # the other two left blank: the page asks once, focus on the first blank one
            page.wait_for_selector("text=You did not answer 2 questions on this page.")
            assert page.locator(".r-blank").count() == 2
            if first == 1:
                assert axe_violations(page) == []
                if width == PHONE["width"]:
                    shot(page, SHOTS, "about-page-1-blank-390")
            # focus moves (autofocus, after htmx settles) to the first blank question, and
            # Tab from there to its first option (none chosen)
            page.wait_for_function(
                "() => document.activeElement && document.activeElement.tagName === 'LEGEND'"
                " && document.activeElement.closest('.r-blank') !== null"
            )
            page.keyboard.press("Tab")
            assert page.evaluate(
                "() => document.activeElement.type === 'radio' && !document.activeElement.checked"
                " && document.activeElement.closest('.r-blank') !== null"
            )
            page.keyboard.press("Enter")
        page.wait_for_selector(f"text=Question {N_ATTRIBUTES + 1} of at most {total}")
        assert axe_violations(page) == []
        shot(page, RESULTS, f"question-{label}")
        for n in range(1, MAX_QUESTIONS + 1):
            page.wait_for_selector(f"text=Question {N_ATTRIBUTES + n} of at most {total}")
            # the focus moves to the question (its autofocus) once htmx settles the swap; a
            # Tab pressed before that would be undone
            page.wait_for_function(
                "() => document.activeElement && document.activeElement.matches('h1.r-qtext')"
            )
            tab_to(page, "el && el.type === 'radio'")
            page.keyboard.press("ArrowDown" if n % 2 else "Space")  # select an option
            assert page.evaluate("() => document.activeElement.checked") is True
            page.keyboard.press("Enter")  # submit (htmx swaps the next question in place)
        page.wait_for_selector("text=Thank you!")
        assert page.url.endswith(f"/s/{slug}/done")
        code = page.locator(".r-code").inner_text().strip()
        assert len(code) >= 6
        assert page.locator("#learned-title").inner_text() == "What we learned about you"
        assert page.locator(".r-learned li").count() >= 1
        assert axe_violations(page) == []
        shot(page, RESULTS, f"done-{label}")
        # no horizontal scrolling at this width
        assert page.evaluate("() => document.documentElement.scrollWidth") <= width
        assert errors == []
    finally:
        context.close()


def test_back_button_skip_prompt_decline_and_delete(
    server: tuple[str, str, str], browser: Any
) -> None:
    """Back to the consent page resumes (no second respondent); an empty page of questions
    about you asks once before skipping them all; "I do not want to take part" after
    answers says what is stored; the deletion page erases by completion code."""
    base, slug, db_url = server
    context = browser.new_context(viewport=PHONE)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        first = page.goto(f"{base}/s/{slug}")
        assert first is not None and first.headers["cache-control"] == "no-store"
        page.click("button[value=accept]")
        page.wait_for_selector("text=A few questions about you")
        n = live_respondents(db_url)
        # Back to the consent page: not shown from the cache; "I agree" again resumes
        page.go_back()
        page.wait_for_load_state("load")
        if page.locator("button[value=accept]").count():
            page.click("button[value=accept]")
        page.wait_for_selector("text=A few questions about you")
        assert live_respondents(db_url) == n
        # nothing chosen on the first page: the prompt, then skip them all
        page.click("button.r-primary")
        page.wait_for_selector("text=Skip all the remaining questions about you?")
        assert axe_violations(page) == []
        shot(page, SHOTS, "about-skip-prompt-390")
        # an answer chosen after the prompt, then Enter: "Continue" (the page asks about the
        # questions left blank), not "skip them all"
        page.check("fieldset.r-question >> nth=0 >> input[type=radio] >> nth=0")
        page.focus("fieldset.r-question >> nth=0 >> input[type=radio] >> nth=0")
        page.keyboard.press("Enter")
        page.wait_for_selector("text=You did not answer 2 questions on this page.")
        assert page.locator("text=Skip all the remaining questions about you?").count() == 0
        page.click("button.r-primary")  # leave them blank: page 2, then the prompt again
        page.wait_for_selector("text=Questions 4 to 6 of at most")
        page.click("button.r-primary")
        page.wait_for_selector("text=Skip all the remaining questions about you?")
        page.click("button[name=skip_all]")
        page.wait_for_selector(f"text=Question {N_ATTRIBUTES + 1} of at most")
        page.check("input[name=option] >> nth=0")
        page.click("button.r-primary")
        page.wait_for_selector(f"text=Question {N_ATTRIBUTES + 2} of at most")
        # Back twice to the consent page and decline: what is stored, and how to delete it
        page.goto(f"{base}/s/{slug}/declined")
        assert page.locator("h1").inner_text() == "You chose not to take part"
        assert "Nothing was recorded" not in page.inner_text("body")
        assert "1 answer to the survey questions" in page.inner_text("body")
        assert axe_violations(page) == []
        shot(page, SHOTS, "declined-after-answers-390")
        page.click("text=Continue the survey")
        for k in range(2, MAX_QUESTIONS + 1):
            page.wait_for_selector(f"text=Question {N_ATTRIBUTES + k} of at most")
            page.check("input[name=option] >> nth=0")
            page.click("button.r-primary")
        page.wait_for_selector("text=Thank you!")
        code = page.locator(".r-code").inner_text().strip()
        shot(page, SHOTS, "done-learned-390")
        assert live_respondents(db_url) == n
    finally:
        context.close()
    # another device: deletion with the completion code
    context = browser.new_context(viewport=PHONE)
    page = context.new_page()
    try:
        erased = erasure_records(db_url)
        page.goto(f"{base}/s/{slug}/delete")
        assert page.locator("h1").inner_text() == "Delete my answers"
        assert axe_violations(page) == []
        shot(page, SHOTS, "delete-390")
        page.fill("#code", "WRONGCODE1")
        page.check("input[name=confirm]")
        page.click("button.r-primary")
        page.wait_for_selector("text=No finished survey has this completion code")
        assert axe_violations(page) == []
        page.fill("#code", code)
        page.check("input[name=confirm]")
        page.click("button.r-primary")
        page.wait_for_selector("text=Your answers were deleted")
        assert axe_violations(page) == []
        shot(page, SHOTS, "deleted-390")
        assert live_respondents(db_url) == n - 1
        assert erasure_records(db_url) == erased + 1  # the existing erasure path's record
        assert errors == []
    finally:
        context.close()


def test_researcher_sees_repeated_starts_and_erases_a_respondent(
    server: tuple[str, str, str], browser: Any
) -> None:
    """The exports have one row per respondent with ``<skip>`` for a declined question about
    the respondent, and the long CSV their demographics; the admin list of live respondents
    flags a repeated start from one browser and erases a respondent after the confirmation
    dialog."""
    from sqlmodel import Session, select

    from app.auth import set_password
    from app.db import make_engine
    from app.tables import Researcher

    base, slug, db_url = server
    engine = make_engine(db_url)
    try:
        with Session(engine) as db:
            owner = db.exec(select(Researcher).where(Researcher.email == "owner@example.org")).one()
            set_password(owner, "e2e owner password 1", session=db)
    finally:
        engine.dispose()
    # one browser starts twice (its session cookie cleared in between)
    context = browser.new_context(viewport=PHONE)
    page = context.new_page()
    try:
        for _ in range(2):
            page.goto(f"{base}/s/{slug}")
            page.click("button[value=accept]")
            page.wait_for_selector("text=A few questions about you")
            context.clear_cookies(name=re.compile(r"priorly_s\d+"))  # the session cookie
    finally:
        context.close()
    n = live_respondents(db_url)
    context = browser.new_context(viewport=DESKTOP)
    page = context.new_page()
    try:
        log_in(page, base, "owner@example.org", "e2e owner password 1")
        # the exports over HTTP: one row per respondent; a declined question about the
        # respondent is <skip>; the long CSV has their demographics
        long = _csv(page.request.get(f"{base}/admin/studies/{slug}/export/answers_long.csv"))
        attributes = {r["item"] for r in long if r["role"] == "attribute"}
        assert len(attributes) == N_ATTRIBUTES
        wide = _csv(page.request.get(f"{base}/admin/studies/{slug}/export/answers_wide.csv"))
        ids = [r["respondent_id"] for r in wide]
        assert len(ids) == len(set(ids)) == live_respondents(db_url)
        finished = [r for r in wide if r["status"] == "completed"]
        assert len(finished) == 2  # the two keyboard surveys: one answer per page of three
        for row in finished:
            cells = [row[k] for k in sorted(attributes)]
            assert cells.count("<skip>") == N_ATTRIBUTES - 3 and "" not in cells, cells
            answered = {r["item"] for r in long if r["respondent_id"] == row["respondent_id"]}
            assert attributes <= answered
        page.goto(f"{base}/admin/studies/{slug}/respondents")
        newest = page.locator("#respondents tbody tr").first
        assert "yes, 1 earlier from this browser" in newest.inner_text()
        assert axe_violations(page) == []
        shot(page, SHOTS, "admin-respondents-1280")
        rid = newest.get_attribute("data-respondent")
        erased = erasure_records(db_url)
        page.on("dialog", lambda dialog: dialog.accept())
        newest.locator("button").click()
        page.wait_for_selector(f"text=Respondent {rid} was erased")
        assert page.locator(f'tr[data-respondent="{rid}"]').count() == 0
        assert live_respondents(db_url) == n - 1
        assert erasure_records(db_url) == erased + 1
    finally:
        context.close()


def test_consent_page_left_open_after_finishing_never_starts_a_second_respondent(
    server: tuple[str, str, str], browser: Any
) -> None:
    """Two tabs show the consent page; the survey is finished in a third tab of the same
    browser. "I agree" in the first old tab shows the completion page, "I do not want to
    take part" in the second says what is stored (not "Nothing was recorded"); no second
    respondent is created."""
    base, slug, db_url = server
    context = browser.new_context(viewport=PHONE)
    try:
        stale = [context.new_page() for _ in range(2)]
        for tab in stale:
            tab.goto(f"{base}/s/{slug}")
            assert tab.locator("h1").inner_text() == "Before you start"
        page = context.new_page()
        page.goto(f"{base}/s/{slug}")
        page.click("button[value=accept]")
        page.wait_for_selector("text=A few questions about you")
        page.click("button.r-primary")  # nothing chosen: the prompt, then skip them all
        page.click("button[name=skip_all]")
        for k in range(1, MAX_QUESTIONS + 1):
            page.wait_for_selector(f"text=Question {N_ATTRIBUTES + k} of at most")
            page.check("input[name=option] >> nth=0")
            page.click("button.r-primary")
        page.wait_for_selector("text=Thank you!")
        code = page.locator(".r-code").inner_text().strip()
        n = live_respondents(db_url)
        stale[0].click("button[value=accept]")
        stale[0].wait_for_selector("text=Thank you!")
        assert stale[0].url.endswith(f"/s/{slug}/done")
        assert stale[0].locator(".r-code").inner_text().strip() == code
        stale[1].click("button[value=decline]")
        stale[1].wait_for_selector("text=You chose not to take part")
        body = stale[1].inner_text("body")
        assert "Nothing was recorded" not in body
        assert f"{MAX_QUESTIONS} answers to the survey questions" in body
        assert axe_violations(stale[1]) == []
        assert live_respondents(db_url) == n
        # every respondent page, as this browser gets it, is sent no-store
        for path in ("", "/q", "/done", "/declined", "/delete"):
            got = page.request.get(f"{base}/s/{slug}{path}")
            assert got.status == 200 and got.headers["cache-control"] == "no-store", path
    finally:
        context.close()


def test_back_after_the_questions_about_you_reloads_the_current_question(
    server: tuple[str, str, str], browser: Any
) -> None:
    """htmx keeps no copy of earlier pages: Back after the questions about you asks the
    server, which shows the current question (not the old, empty page about you, whose
    answers would be dropped); every page's window title follows the page shown."""
    base, slug, _db_url = server
    context = browser.new_context(viewport=DESKTOP)
    page = context.new_page()
    try:
        page.goto(f"{base}/s/{slug}")
        page.click("button[value=accept]")
        for number in range(1, 4):
            page.wait_for_selector(f"#survey input[name=page][value='{number}']", state="attached")
            assert re.search(rf": about you \({number} of 3\)$", page.title()), page.title()
            page.evaluate(
                """() => {
                    const names = new Set(
                        [...document.querySelectorAll('#survey input[type=radio]')].map(e => e.name));
                    for (const n of names) document.querySelector(`input[name="${n}"]`).click();
                }"""
            )
            page.click("button.r-primary")
        first = N_ATTRIBUTES + 1
        page.wait_for_selector(f"text=Question {first} of at most")
        assert page.title().endswith(f": question {first}"), page.title()
        page.check("input[name=option] >> nth=0")
        page.click("button.r-primary")
        page.wait_for_selector(f"text=Question {first + 1} of at most")
        assert page.title().endswith(f": question {first + 1}"), page.title()
        with page.expect_event("load"):  # a reload from the server, not a cached snapshot
            page.go_back()
        page.wait_for_selector(f"text=Question {first + 1} of at most")
        assert page.locator("text=A few questions about you").count() == 0
        stored = page.evaluate(
            "() => Object.keys(sessionStorage).concat(Object.keys(localStorage))"
        )
        assert "htmx-history-cache" not in stored, stored  # no copy of the pages kept
    finally:
        context.close()


def test_long_words_wrap_and_right_to_left_text_keeps_its_direction(
    server: tuple[str, str, str], browser: Any
) -> None:
    """A 126-letter word in the question or an option label wraps (the phone page stays
    390 px wide, no zooming out); an Arabic label is laid out right to left (``dir="auto"``
    on the researcher's texts)."""
    base, slug, _ = server
    context = browser.new_context(viewport=PHONE)
    page = context.new_page()
    try:
        page.goto(f"{base}/s/{slug}")
        page.click("button[value=accept]")
        page.wait_for_selector("text=A few questions about you")
        page.click("button.r-primary")  # nothing chosen: the prompt, then skip them all
        page.click("button[name=skip_all]")
        page.wait_for_selector(f"text=Question {N_ATTRIBUTES + 1} of at most")
        page.evaluate(
            """() => {
                const word = 'Donaudampfschifffahrtsgesellschaftskapitaen'.repeat(3);
                const spans = document.querySelectorAll('.r-option span');
                spans[0].textContent = word;
                spans[1].textContent = 'نعم، أوافق.';
                document.querySelector('.r-qtext').textContent = word;
            }"""
        )
        assert page.evaluate("() => document.documentElement.scrollWidth") <= PHONE["width"]
        directions = page.evaluate(
            """() => [...document.querySelectorAll('.r-option span')].slice(0, 2)
                    .map(e => getComputedStyle(e).direction)"""
        )
        assert directions == ["ltr", "rtl"]
    finally:
        context.close()


def test_dark_appearance(server: tuple[str, str, str], browser: Any) -> None:
    """A device set to a dark appearance gets the pages in dark colours, every state with
    enough contrast for axe-core: consent, questions about you with a blank one flagged, a
    question with an option chosen, the completion page."""
    base, slug, _ = server
    context = browser.new_context(viewport=PHONE, color_scheme="dark")
    page = context.new_page()
    background = "() => getComputedStyle(document.body).backgroundColor"
    try:
        page.goto(f"{base}/s/{slug}")
        assert page.evaluate(background) == "rgb(17, 20, 24)"
        assert axe_violations(page) == []
        page.click("button[value=accept]")
        page.wait_for_selector("text=A few questions about you")
        page.check("fieldset.r-question >> nth=0 >> input[type=radio] >> nth=0")
        page.click("button.r-primary")
        page.wait_for_selector("text=You did not answer 2 questions on this page.")
        assert axe_violations(page) == []
        for first in (4, 7):
            page.click("button.r-primary")  # leave the rest blank
            page.wait_for_selector(f"text=Questions {first} to {first + 2} of at most")
            page.check("fieldset.r-question >> nth=0 >> input[type=radio] >> nth=0")
            page.click("button.r-primary")
            page.wait_for_selector("text=You did not answer 2 questions on this page.")
        page.click("button.r-primary")
        for k in range(1, MAX_QUESTIONS + 1):
            page.wait_for_selector(f"text=Question {N_ATTRIBUTES + k} of at most")
            page.check("input[name=option] >> nth=0")
            chosen = page.locator(".r-option").first
            assert chosen.evaluate("el => getComputedStyle(el).backgroundColor") == (
                "rgb(30, 51, 82)"
            )
            if k == 1:
                assert axe_violations(page) == []
                shot(page, SHOTS, "question-dark-390")
            page.click("button.r-primary")
        page.wait_for_selector("text=Thank you!")
        assert page.evaluate(background) == "rgb(17, 20, 24)"
        assert axe_violations(page) == []
        shot(page, SHOTS, "done-dark-390")
    finally:
        context.close()
