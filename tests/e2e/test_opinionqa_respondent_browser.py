"""A respondent of an OpinionQA-based study with a CAPE belief model, against ``priorly
serve`` in its own process: in a real headless Chromium the pages of questions about the
respondent word OpinionQA's bare attribute labels ("age", "sex", ...) as questions ("What
is your age?"), and axe-core finds no serious violation on them; over HTTP, a respondent
who finishes sees no "what we learned about you" section while the study's
``show_learned`` setting was never set, and with it on sees the CAPE preference profile
("What matters to you"), line for line the criteria of
:func:`app.services.learned.learned_about`.

The study: the first :data:`N_ROWS` OpinionQA respondents imported, its question items
marked as preference criteria, ``cape_linear`` fitted through
:func:`app.services.belief.fit_study_model`.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlmodel import select

from app import session as svc
from app.services.belief import fit_study_model
from app.services.demo import prepare_study_for_fielding
from app.services.learned import MAX_PREFERENCES, learned_about
from app.tables import ElicitationSession, Item, Study
from tests.support.browser import AXE_JS, PHONE, RESULTS, axe_violations, shot
from tests.support.data import DATASETS_DIR, write_small_dataset
from tests.support.live_study import LiveStudy, make_live_study, priorly_serve, study_settings
from tests.support.respondent import about, consent, finish

N_ROWS = 150
MAX_QUESTIONS = 3
LEARNED = "What we learned about you"
LINE = re.compile(
    r"<li>We think you would answer “<bdi>([^<]+)</bdi>” to “<bdi>([^<]+)</bdi>” \((\d+)% sure\)"
)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveStudy, str]]:
    """``(live study, base URL)``: the CAPE study (``show_learned`` never set) on a SQLite
    file, served by ``priorly serve``."""
    folder = tmp_path_factory.mktemp("opinionqa-e2e")
    svc.clear_runtime_cache()
    data = write_small_dataset(DATASETS_DIR / "opinionqa", folder / "opinionqa", N_ROWS)
    live = make_live_study(
        f"sqlite:///{folder / 'opinionqa.db'}",
        data,
        n_classes=(2,),
        settings={"budgets": {"max_questions": MAX_QUESTIONS}},
    )
    with live.session() as db:
        study = db.get(Study, live.study_id)
        assert study is not None
        for it in db.exec(select(Item).where(Item.study_id == live.study_id)).all():
            it.is_preference_criterion = it.role == "question"
            db.add(it)
        db.commit()
        fit_study_model(
            study,
            session=db,
            belief_model="cape_linear",
            fit_options={"cape_linear": {"dims": (1,)}},
            force=True,
        )
        prepare_study_for_fielding(study, session=db)
    svc.clear_runtime_cache()
    try:
        with priorly_serve(live.url, folder) as base:
            yield live, base
    finally:
        svc.clear_runtime_cache()
        live.engine.dispose()


def bare_labels() -> dict[str, str]:
    """OpinionQA's attribute items (its demographics and region column): key -> the
    codebook's bare question text."""
    meta = json.loads((DATASETS_DIR / "opinionqa" / "dataset.json").read_text(encoding="utf-8"))
    lines = (DATASETS_DIR / "opinionqa" / "codebook.jsonl").read_text(encoding="utf-8")
    book = {e["id"]: e["question"] for e in map(json.loads, filter(str.strip, lines.splitlines()))}
    return {key: book[key] for key in [*meta["demographics"], meta["region_column"]]}


def test_about_you_pages_word_the_bare_labels(served: tuple[LiveStudy, str], browser: Any) -> None:
    from playwright.sync_api import expect

    live, base = served
    labels = bare_labels()
    assert labels["F_AGECAT"] == "age" and labels["F_SEX"] == "sex"  # bare in the codebook
    legends: list[str] = []
    context = browser.new_context(viewport=PHONE)
    try:
        page = context.new_page()
        page.goto(f"{base}/s/{live.slug}")
        page.click("button[value=accept]")
        number = 1
        while page.locator("input[name=page]").count():
            expect(page.locator("input[name=page]")).to_have_value(str(number))
            assert axe_violations(page) == [], f"about-you page {number}"
            if number == 1:
                shot(page, RESULTS, "opinionqa-about-390")
            legends += page.locator("legend.r-legend").all_inner_texts()
            for fieldset in page.locator("fieldset.r-question").all():
                fieldset.locator("input[type=radio]").first.check()
            page.click("button.r-primary")
            number += 1
            expect(
                page.locator(f"input[name=page][value='{number}'], input[name=item]")
            ).to_have_count(1)
    finally:
        context.close()
    assert AXE_JS.is_file()
    assert sorted(legends) == sorted(f"What is your {label}?" for label in labels.values())
    assert not set(legends) & set(labels.values())


def test_learned_section_is_off_by_default(served: tuple[LiveStudy, str]) -> None:
    live, base = served
    with live.session() as db:
        study = db.get(Study, live.study_id)
        assert study is not None and study.settings.get("show_learned", False) is False  # import
    with httpx.Client(base_url=base, timeout=60) as client:
        consent(client, live)
        about(client, live, {"F_AGECAT": "B"})
        finish(client, live)
        done = client.get(f"/s/{live.slug}/done").text
    assert "Thank you!" in done and LEARNED not in done and "r-learned" not in done


def test_cape_preference_profile_on_the_done_page(served: tuple[LiveStudy, str]) -> None:
    live, base = served
    with study_settings(live, show_learned=True), httpx.Client(base_url=base, timeout=60) as client:
        consent(client, live)
        about(client, live, {})
        finish(client, live)
        done = client.get(f"/s/{live.slug}/done").text
        with live.session() as db:
            study = db.get(Study, live.study_id)
            sess = db.exec(
                select(ElicitationSession).order_by(ElicitationSession.id.desc())
            ).first()
            assert study is not None and sess is not None and sess.status == "completed"
            expected = learned_about(study, sess, session=db).preferences
    assert 1 <= len(expected) <= MAX_PREFERENCES
    assert LEARNED in done and "What matters to you" in done
    shown = LINE.findall(html.unescape(done.split("What matters to you", 1)[1]))
    assert shown == [(g.answer, g.question, str(g.percent)) for g in expected]
