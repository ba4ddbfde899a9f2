"""A study whose respondent pages are German (``StudySettings.language = "de"``) through
the real app (TestClient, SQLite): consent, questions about the respondent (with the
skip prompt and a blank question), a question (with a refusal), completion, declining
and deleting, and a mistyped survey address all say ``lang="de"``, show the catalogue's
German words and no English text of the catalogue; the researcher's texts stay as they
were written."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from html.parser import HTMLParser
from typing import Any

import pytest
from sqlmodel import select

from app import respondent_text as rt
from app import session as svc
from app.tables import Item, Study
from tests.support.data import DATASETS_DIR, write_small_dataset
from tests.support.live_study import LiveStudy, app_client, fresh_database_url, make_live_study
from tests.support.respondent import attribute_pages, field, first_option


@pytest.fixture(scope="module")
def german(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStudy]:
    folder = tmp_path_factory.mktemp("lang")
    for url in fresh_database_url("sqlite", folder):
        svc.clear_runtime_cache()
        data = write_small_dataset(DATASETS_DIR / "ces", folder / "ces60", 60)
        study = make_live_study(
            url, data, settings={"language": "de", "budgets": {"max_questions": 3}}
        )
        yield study
        study.engine.dispose()


@pytest.fixture
def client(german: LiveStudy) -> Iterator[Any]:
    with app_client(german.url) as c:
        yield c


class _Shown(HTMLParser):
    """The text a page shows or says: text outside scripts and styles, and the attributes
    that carry words (``data-messages`` holds the script's sentences)."""

    WORDY = ("aria-label", "title", "alt", "placeholder")

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("script", "style"):
            self._skip += 1
        self.parts += [v for k, v in attrs if k in self.WORDY and v]
        self.parts += [
            said for k, v in attrs if k == "data-messages" and v for said in json.loads(v).values()
        ]

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style"):
            self._skip -= 1

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.parts.append(data)


def english_fragments() -> set[str]:
    """The words of every English text of the catalogue between its placeholders and tags
    (at least 4 characters with a letter): what must not show on a German page."""
    found: set[str] = set()
    for texts in rt.MESSAGES.values():
        english = texts["en"]
        for template in english.values() if isinstance(english, dict) else [english]:
            for piece in re.split(r"\{[^}]*\}|<[^>]*>", template):
                piece = piece.strip(" .,:;()“”")
                if len(piece) >= 4 and re.search(r"[A-Za-z]", piece):
                    found.add(piece)
    return found


def researcher_texts(live: LiveStudy) -> list[str]:
    """Everything the researcher wrote for the study (name, consent text, questions,
    topics, keys and options), longest first: shown as written, in any language."""
    with live.session() as db:
        study = db.get(Study, live.study_id)
        assert study is not None
        texts = [study.name, study.slug, study.consent_text or ""]
        for item in db.exec(select(Item).where(Item.study_id == live.study_id)).all():
            texts += [item.question, item.topic or "", item.key]
            texts += [label for _, label in item.options]
    return sorted({t for t in texts if t}, key=len, reverse=True)


def assert_german(page: Any, live: LiveStudy, *expected: str) -> None:
    """Fail unless the page is ``lang="de"``, shows each of the
    ``expected`` German texts and no English text of the catalogue."""
    assert '<html lang="de">' in page.text
    parser = _Shown()
    parser.feed(page.text)
    shown = "\n".join(parser.parts)
    for text in expected:
        assert text in shown, f"{text!r} not on the page"
    for text in researcher_texts(live):
        shown = shown.replace(text, "\n")
    shown = re.sub(r"https?://\S+|\{\w+\}", "\n", shown)  # links, the script's placeholders
    leaked = sorted(f for f in english_fragments() if f in shown)
    assert leaked == [], f"English on a German page: {leaked}"


def de(key: str, **params: Any) -> str:
    return rt.text("de", key, **params)


def test_a_german_study_speaks_german_on_every_respondent_page(
    client: Any, german: LiveStudy
) -> None:
    slug = german.slug
    pages = attribute_pages(german)
    n_attributes = sum(len(p) for p in pages)
    assert len(pages) >= 2 and len(pages[0]) == 3  # (the CES demographics)
    start = client.get(f"/s/{slug}")
    assert start.status_code == 200
    assert_german(start, german, de("consent.heading"), de("consent.agree"))
    r = client.post(f"/s/{slug}/consent", data={"choice": "accept"}, follow_redirects=False)
    assert r.status_code == 303

    # questions about the respondent: the first page, the skip prompt, a blank question
    about = client.get(f"/s/{slug}/q")
    assert_german(
        about,
        german,
        de("about.heading"),
        de("progress.questions", first=1, last=3, total=n_attributes + 3),
        de("button.prefer_not"),
        de("button.continue"),
        de("resume.summary"),
    )
    assert "Angaben zu Ihrer Person (1 von" in html.unescape(about.text.split("</title>")[0])
    prompt = client.post(f"/s/{slug}/about", data={"page": "1"})
    assert_german(prompt, german, de("about.skip_all"), de("about.or_choose"))
    first, second = pages[0][0], pages[0][1]
    blank = client.post(f"/s/{slug}/about", data={"page": "1", f"a_{first}": "A"})
    assert_german(blank, german, "Sie haben 2 Fragen auf dieser Seite nicht beantwortet.")
    assert de("about.not_answered") in blank.text
    for number, keys in enumerate(pages, start=1):
        data = {f"a_{k}": "__skip__" if k == second else "A" for k in keys}
        client.post(f"/s/{slug}/about", data={**data, "page": str(number)})

    # a question, refused once without an answer, then every question to the end
    page = client.get(f"/s/{slug}/q")
    assert_german(
        page,
        german,
        de("progress.question", number=n_attributes + 1, total=n_attributes + 3),
        de("button.next"),
        de("question.saved_hint", button=de("button.next")),
        rt.pattern("de", "js.send_error.answer"),  # the script's sentences, from the page
    )
    assert "<title>" in page.text and f": Frage {n_attributes + 1}</title>" in page.text
    data = {
        "item": field(page.text, "item"),
        "idempotency_key": field(page.text, "idempotency_key"),
    }
    refused = client.post(f"/s/{slug}/answer", data=data)
    assert refused.status_code == 422
    assert_german(refused, german, de("question.choose_or_skip"))
    while 'name="item"' in page.text:
        data["item"], data["option"] = field(page.text, "item"), first_option(page.text)
        data["idempotency_key"] = field(page.text, "idempotency_key")
        page = client.post(f"/s/{slug}/answer", data=data)
    done = client.get(f"/s/{slug}/done")
    assert done.status_code == 200
    assert_german(done, german, de("done.heading"), de("done.code"), "löschen lassen")

    # declining afterwards: what is stored, then deleting it from this browser
    declined = client.get(f"/s/{slug}/declined")
    assert_german(
        declined,
        german,
        de("declined.heading"),
        de("declined.stored_finished"),
        de("count.answered", count=3),
        de("count.attributes", count=n_attributes - 1),
        de("declined.show_code"),
    )
    delete = client.get(f"/s/{slug}/delete")
    assert_german(delete, german, de("delete.intro"), de("delete.this_browser"))
    unticked = client.post(f"/s/{slug}/delete", data={"use_browser": "1"})
    assert unticked.status_code == 422
    assert_german(unticked, german, de("delete.error_confirm"))
    deleted = client.post(f"/s/{slug}/delete", data={"use_browser": "1", "confirm": "yes"})
    assert deleted.status_code == 200
    assert_german(
        deleted,
        german,
        de("deleted.title"),
        "Wir haben alles gelöscht, was in dieser Umfrage über Sie gespeichert war: 3 Antworten "
        f"auf die Fragen der Umfrage und {n_attributes - 1} Antworten auf die Fragen zu Ihrer "
        "Person.",
    )


def test_declining_and_a_wrong_address_are_german_too(client: Any, german: LiveStudy) -> None:
    r = client.post(f"/s/{german.slug}/consent", data={"choice": "decline"})
    assert r.status_code == 200
    assert_german(r, german, de("declined.heading"), de("declined.nothing"))
    missing = client.get(f"/s/{german.slug}/no/such/page")
    assert missing.status_code == 404
    assert_german(missing, german, de("not_found.title"), de("not_found.text"))
    code = client.post(f"/s/{german.slug}/delete", data={"code": "WRONG", "confirm": "yes"})
    assert code.status_code == 422
    assert_german(code, german, de("delete.error_code"), de("delete.code_label"))
    # a survey that does not exist knows no language: English
    unknown = client.get("/s/no-such-survey")
    assert unknown.status_code == 404 and '<html lang="en">' in unknown.text
    assert rt.text("en", "not_open.title") in unknown.text
