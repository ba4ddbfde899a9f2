"""The study designer and the import flows through the admin pages (TestClient)."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from app.settings import Settings
from app.tables import Item, Researcher, Respondent, Study
from tests.support.admin import csrf, login


@pytest.fixture
def shipped(tmp_path: Path, small_dataset_factory: Callable[..., Path]) -> Path:
    """A datasets folder with one small canonical dataset, ``ces_small``."""
    folder = small_dataset_factory("ces", 60, folder="datasets/ces_small")
    return folder.parent


@pytest.fixture
def dclient(settings: Settings, shipped: Path) -> Iterator[TestClient]:
    from app.main import create_app

    s = settings.model_copy(update={"demo_dataset": shipped / "ces_small"})
    with TestClient(create_app(s), base_url="http://localhost") as c:
        yield c


def test_create_study_items_roles_budgets_texts_publish(
    dclient: TestClient, alice: Researcher, db: Session
) -> None:
    login(dclient, "alice@example.org")
    r = dclient.post("/admin/studies", data={"name": "Trust 2026", "csrf_token": csrf(dclient)})
    assert r.status_code == 200 and "Trust 2026" in r.text  # followed the redirect
    study = db.exec(select(Study).where(Study.slug == "trust-2026")).one()
    assert study.owner_id == alice.id and study.status == "draft"
    base = "/admin/studies/trust-2026"
    # items: a question, a target; an invalid one shows the error inline
    ok = dclient.post(
        base + "/items",
        data={
            "key": "q1",
            "question": "Trust parliament?",
            "options": "A: Yes\nB: No",
            "role": "question",
            "is_preference_criterion": "on",
            "csrf_token": csrf(dclient),
        },
    )
    assert ok.status_code == 200 and "item added" in ok.text
    dclient.post(
        base + "/items",
        data={
            "key": "t1",
            "question": "Vote?",
            "options": "Yes\nNo\nUnsure",
            "role": "target",
            "csrf_token": csrf(dclient),
        },
    )
    bad = dclient.post(
        base + "/items",
        data={
            "key": "q2",
            "question": "One option only",
            "options": "Yes",
            "role": "question",
            "csrf_token": csrf(dclient),
        },
    )
    assert bad.status_code == 422 and "at least two options" in bad.text
    # the error is also next to the items, where the form posts back to (#items)
    assert bad.text.split('id="items"')[1].split('id="items-error">')[1].startswith("an item")
    assert f'action="{base}/items#items"' in bad.text
    items = {it.key: it for it in db.exec(select(Item).where(Item.study_id == study.id)).all()}
    assert set(items) == {"q1", "t1"}
    assert items["q1"].is_preference_criterion and items["q1"].options == [
        ["A", "Yes"],
        ["B", "No"],
    ]
    assert items["t1"].role == "target" and items["t1"].options[2] == ["C", "Unsure"]
    # change a role
    r = dclient.post(
        f"{base}/items/{items['q1'].id}", data={"role": "attribute", "csrf_token": csrf(dclient)}
    )
    assert r.status_code == 200
    db.refresh(items["q1"])
    assert items["q1"].role == "attribute" and not items["q1"].is_preference_criterion
    dclient.post(
        f"{base}/items/{items['q1'].id}", data={"role": "question", "csrf_token": csrf(dclient)}
    )
    # budgets: an inconsistent pair is refused with the field named
    form = {
        "criterion": "eig",
        "max_questions": "3",
        "min_questions": "5",
        "rounds": "2",
        "respondents_share": "0.5",
        "max_questions_per_respondent": "1",
        "allow_skip": "on",
        "csrf_token": csrf(dclient),
    }
    r = dclient.post(base + "/settings", data=form)
    assert (
        r.status_code == 422 and "Questions: min questions (5) exceeds max questions (3)" in r.text
    )
    # the refused form shows what was typed, not the stored values; a reload of the
    # form's address goes to the study page
    assert 'name="min_questions" min="0" value="5"' in r.text
    assert 'name="rounds" min="1" value="2"' in r.text
    r = dclient.get(base + "/settings", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == base
    r = dclient.post(
        base + "/settings",
        data={**form, "min_questions": "1", "total_answers": "500", "respondents_per_round": "40"},
    )
    assert r.status_code == 200
    # 5 calibration questions (the default) of at most 3: lowered to 2, and said so
    assert "calibration questions lowered to 2 (at most max questions − 1" in r.text
    db.refresh(study)
    assert (
        study.settings["budgets"]["max_questions"] == 3
        and study.settings["budgets"]["min_questions"] == 1
        and study.settings["calibration_items"] == 2
    )
    # a bound is refused in the form's words, with what was typed
    r = dclient.post(
        base + "/settings", data={**form, "min_questions": "1", "stop_eig_threshold": "-1"}
    )
    assert r.status_code == 422
    assert "Stop when best EIG below: must be at least 0 (you typed -1)" in r.text
    assert study.settings["group"] == {
        "rounds": 2,
        "respondents_per_round": 40,
        "respondents_share": 0.5,
        "total_answers": 500,
        "max_questions_per_respondent": 1,
        "panel": "auto",
    }
    assert study.settings["drop_after_minutes"] == 60  # not in the form: the default kept
    # an empty share keeps the stored one (the count is what is used when set)
    r = dclient.post(
        base + "/settings",
        data={**form, "min_questions": "1", "respondents_per_round": "3", "respondents_share": ""},
    )
    assert r.status_code == 200, r.text
    db.refresh(study)
    assert study.settings["group"]["respondents_per_round"] == 3
    assert study.settings["group"]["respondents_share"] == 0.5
    # "show respondents what we learned": a tick box of the form, off when not ticked
    assert study.settings.get("show_learned", False) is False
    page = dclient.get(base).text
    assert re.search(r'<input type="checkbox" name="show_learned" +aria-describedby', page)
    assert "show respondents what we learned about them" in page
    r = dclient.post(base + "/settings", data={**form, "min_questions": "1", "show_learned": "on"})
    assert r.status_code == 200
    db.refresh(study)
    assert study.settings["show_learned"] is True
    assert re.search(r'name="show_learned" checked aria-describedby', dclient.get(base).text)
    # the dashboard's "dropped" threshold: a positive whole number of minutes, kept when
    # the field is left empty; a refused form keeps the tick box as posted
    r = dclient.post(
        base + "/settings",
        data={**form, "min_questions": "1", "drop_after_minutes": "0", "show_learned": "on"},
    )
    assert r.status_code == 422 and "drop_after_minutes" in r.text
    assert re.search(r'name="show_learned" checked aria-describedby', r.text)
    r = dclient.post(
        base + "/settings", data={**form, "min_questions": "1", "drop_after_minutes": "90"}
    )
    assert r.status_code == 200
    db.refresh(study)
    assert study.settings["drop_after_minutes"] == 90 and study.settings["show_learned"] is False
    assert 'name="drop_after_minutes" min="1" value="90"' in dclient.get(base).text
    # calibration: kept when left empty, a clear error when negative
    assert study.settings["calibration_min_answers"] == 300  # a new study's
    r = dclient.post(
        base + "/settings",
        data={
            **form,
            "min_questions": "1",
            "calibration_items": "1",
            "calibration_min_answers": "-1",
        },
    )
    assert r.status_code == 422 and "calibration_min_answers" in r.text
    r = dclient.post(
        base + "/settings",
        data={
            **form,
            "min_questions": "1",
            "calibration_items": "1",
            "calibration_min_answers": "40",
        },
    )
    assert r.status_code == 200
    db.refresh(study)
    assert (study.settings["calibration_items"], study.settings["calibration_min_answers"]) == (
        1,
        40,
    )
    r = dclient.post(base + "/settings", data={**form, "min_questions": "1"})
    db.refresh(study)
    assert (study.settings["calibration_items"], study.settings["calibration_min_answers"]) == (
        1,
        40,
    )
    assert 'name="calibration_min_answers" min="0" value="40"' in dclient.get(base).text
    # empty budget and group fields keep their stored values; a number that only Python
    # reads (underscores, Arabic-Indic digits, 3.5 for a whole number) names its field
    r = dclient.post(base + "/settings", data={**form, "min_questions": "", "max_questions": "",
                                               "rounds": "", "max_questions_per_respondent": ""})  # fmt: skip
    assert r.status_code == 200
    db.refresh(study)
    assert (
        study.settings["budgets"]["max_questions"] == 3 and study.settings["group"]["rounds"] == 2
    )
    for bad in ("1_0", "\u0663", "3.5", "9" * 5000):
        r = dclient.post(
            base + "/settings", data={**form, "min_questions": "1", "max_questions": bad}
        )
        assert r.status_code == 422 and "Max questions: not a whole number" in r.text, bad
        if len(bad) > 40:  # the message clips the value (the field shows what was typed)
            assert f"not a whole number: &#39;{'9' * 40}…&#39;" in r.text
    # the share of the panel as a census table or a person writes it: 10 % is 0.1
    r = dclient.post(base + "/settings", data={**form, "min_questions": "1",
                                               "respondents_share": "10%"})  # fmt: skip
    assert r.status_code == 200, r.text
    db.refresh(study)
    assert study.settings["group"]["respondents_share"] == pytest.approx(0.1)
    r = dclient.post(base + "/settings", data={**form, "min_questions": "1",
                                               "respondents_per_round": "2.5"})  # fmt: skip
    assert r.status_code == 422 and "Respondents per round: not a whole number" in r.text
    r = dclient.post(base + "/settings", data={**form, "min_questions": "1",
                                               "respondents_per_round": "99999"})  # fmt: skip
    assert r.status_code == 200
    assert "99999 respondents per round is more than the study&#39;s 0 respondents" in r.text
    r = dclient.post(base + "/settings", data={**form, "min_questions": "1",
                                               "respondents_per_round": ""})  # fmt: skip
    assert r.status_code == 200 and "more than the study" not in r.text
    # a field sent twice (a crafted form: the page has one) is refused, nothing stored
    twice = {**form, "min_questions": "1", "max_questions": ["3", "7"]}
    r = dclient.post(base + "/settings", data=twice)
    assert r.status_code == 422 and "max_questions: sent 2 times" in r.text
    db.refresh(study)
    assert study.settings["budgets"]["max_questions"] == 3
    # publish needs a consent text
    r = dclient.post(base + "/status", data={"status": "published", "csrf_token": csrf(dclient)})
    assert r.status_code == 422 and "consent" in r.text
    # the refusal is also shown next to the Publish button, where the form scrolls to
    status_card = r.text.split('id="status"')[1].split("</section>")[0]
    assert 'id="status-error"' in status_card and "consent" in status_card
    assert 'action="/admin/studies/' + study.slug + '/status#status"' in status_card
    assert 'data-confirm="Close this study?' in status_card
    texts = {
        "name": "Trust 2026",
        "description": "d",
        "consent_text": "I agree.",
        "completion_code": "DONE-42",
        "redirect_url": "ftp://x",
        "csrf_token": csrf(dclient),
    }
    assert dclient.post(base + "/texts", data=texts).status_code == 422
    assert (
        dclient.post(
            base + "/texts", data={**texts, "redirect_url": "https://panel.example/done"}
        ).status_code
        == 200
    )
    r = dclient.post(base + "/status", data={"status": "published", "csrf_token": csrf(dclient)})
    assert r.status_code == 200
    db.refresh(study)
    assert study.status == "published" and study.completion_code == "DONE-42"
    assert study.redirect_url == "https://panel.example/done"
    dclient.post(base + "/status", data={"status": "closed", "csrf_token": csrf(dclient)})
    db.refresh(study)
    assert study.status == "closed"


def test_import_shipped_dataset(dclient: TestClient, alice: Researcher, db: Session) -> None:
    login(dclient, "alice@example.org")
    page = dclient.get("/admin/import")
    assert "ces_small" in page.text
    r = dclient.post(
        "/admin/import/shipped",
        data={"dataset": "ces_small", "name": "My CES", "csrf_token": csrf(dclient)},
    )
    assert r.status_code == 200
    study = db.exec(select(Study).where(Study.slug == "my-ces")).one()
    assert study.owner_id == alice.id
    assert len(db.exec(select(Respondent).where(Respondent.study_id == study.id)).all()) == 60
    again = dclient.post(
        "/admin/import/shipped",
        data={"dataset": "ces_small", "name": "My CES", "csrf_token": csrf(dclient)},
    )
    assert again.status_code == 422 and "already exists" in again.text
    long = dclient.post(
        "/admin/import/shipped",
        data={"dataset": "ces_small", "name": "n" * 5000, "csrf_token": csrf(dclient)},
    )
    assert long.status_code == 422 and "5,000 characters; the limit is 200" in long.text
    missing = dclient.post(
        "/admin/import/shipped", data={"dataset": "../etc", "csrf_token": csrf(dclient)}
    )
    assert missing.status_code == 422 and "no shipped dataset" in missing.text


def _files(folder: Path, *names: str) -> dict[str, tuple[str, bytes, str]]:
    return {n: (n, (folder / n).read_bytes(), "application/octet-stream") for n in names}


def test_upload_preview_errors_inline_and_import(
    dclient: TestClient, alice: Researcher, db: Session, small_dataset_factory: Callable[..., Path]
) -> None:
    folder = small_dataset_factory("ces", 25, folder="upload")
    login(dclient, "alice@example.org")
    fields = {"name": "Uploaded CES", "attributes": "birthyr,gender4", "csrf_token": csrf(dclient)}
    # preview of a plain CSV + codebook (no dataset.json): validated, nothing written
    r = dclient.post(
        "/admin/import/upload",
        data={**fields, "action": "preview"},
        files=_files(folder, "responses.csv", "codebook.jsonl"),
    )
    assert r.status_code == 200, r.text
    assert 'id="preview"' in r.text and "25 respondents" in r.text and "2 attributes" in r.text
    assert db.exec(select(Study)).all() == []
    # a broken codebook: the importer's message (file and line) is shown inline, nothing written
    bad = (folder / "codebook.jsonl").read_text(encoding="utf-8").splitlines()
    bad[2] = bad[2].replace('"options"', '"opts"')
    (folder / "broken.jsonl").write_text("\n".join(bad) + "\n", encoding="utf-8")
    files = _files(folder, "responses.csv")
    files["codebook.jsonl"] = (
        "codebook.jsonl",
        (folder / "broken.jsonl").read_bytes(),
        "application/octet-stream",
    )
    r = dclient.post("/admin/import/upload", data={**fields, "action": "import"}, files=files)
    assert r.status_code == 422 and "codebook.jsonl" in r.text and 'class="error"' in r.text
    assert db.exec(select(Study)).all() == []
    # a header that repeats a column is blamed on responses.csv (no dataset.json uploaded)
    lines = (folder / "responses.csv").read_text(encoding="utf-8").splitlines()
    header = lines[0].split(",")
    dup = (
        ",".join([*header, header[2]])
        + "\n"
        + "\n".join(f"{row},{row.split(',')[2]}" for row in lines[1:])
    )
    files = _files(folder, "codebook.jsonl")
    files["responses.csv"] = ("responses.csv", dup.encode(), "text/csv")
    r = dclient.post("/admin/import/upload", data={**fields, "action": "preview"}, files=files)
    assert r.status_code == 422
    assert f"responses.csv: the header repeats the column &#39;{header[2]}&#39;" in r.text
    # import for real
    r = dclient.post(
        "/admin/import/upload",
        data={**fields, "action": "import"},
        files=_files(folder, "responses.csv", "codebook.jsonl"),
    )
    assert r.status_code == 200, r.text
    study = db.exec(select(Study).where(Study.slug == "uploaded-ces")).one()
    roles = {it.key: it.role for it in db.exec(select(Item).where(Item.study_id == study.id)).all()}
    assert roles["birthyr"] == "attribute" and roles["327a"] == "question"
    assert len(db.exec(select(Respondent).where(Respondent.study_id == study.id)).all()) == 25


def test_a_codebook_alone_imports_a_study_without_history(
    dclient: TestClient, alice: Researcher, db: Session, small_dataset_factory: Callable[..., Path]
) -> None:
    """A codebook without responses.csv (or with a header-only one) previews as 0
    respondents with a note and imports the items, attribute roles included; without a
    codebook the upload is refused by name and nothing is written."""
    folder = small_dataset_factory("ces", 20, folder="codebook-only")
    login(dclient, "alice@example.org")
    fields = {"name": "New wave", "attributes": "birthyr,gender4", "csrf_token": csrf(dclient)}
    r = dclient.post(
        "/admin/import/upload",
        data={**fields, "action": "preview"},
        files=_files(folder, "codebook.jsonl"),
    )
    assert r.status_code == 200, r.text
    n_items = len((folder / "codebook.jsonl").read_text(encoding="utf-8").splitlines())
    assert f"0 respondents, {n_items} items" in r.text and "2 attributes" in r.text
    assert "No respondents: the study starts without history" in r.text
    r = dclient.post("/admin/import/upload", data={**fields, "action": "import"}, files={})
    assert r.status_code == 422 and "upload codebook.jsonl" in r.text
    empty = {"codebook.jsonl": ("codebook.jsonl", b"", "application/octet-stream")}
    r = dclient.post("/admin/import/upload", data={**fields, "action": "import"}, files=empty)
    assert r.status_code == 422 and "codebook.jsonl: the file is empty" in r.text
    one = (
        b'{"id": "a", "question": "Q?", "options": {"A": "x"}}\n'
        + (folder / "codebook.jsonl").read_bytes()
    )
    r = dclient.post(
        "/admin/import/upload",
        data={**fields, "action": "preview"},
        files={"codebook.jsonl": ("codebook.jsonl", one, "application/octet-stream")},
    )
    assert (
        r.status_code == 422 and "codebook.jsonl, line 1: item &#39;a&#39; has 1 option" in r.text
    )
    # a typo in the form's attribute columns names the field, not a dataset.json
    r = dclient.post(
        "/admin/import/upload",
        data={**fields, "attributes": "birthyr,gendr", "action": "preview"},
        files=_files(folder, "codebook.jsonl"),
    )
    assert r.status_code == 422
    assert "Attribute columns: &#39;gendr&#39; is not an item of codebook.jsonl" in r.text
    r = dclient.post(
        "/admin/import/upload",
        data={**fields, "attributes": "gendr", "action": "preview"},
        files=_files(folder, "codebook.jsonl", "responses.csv"),
    )
    assert "Attribute columns: &#39;gendr&#39; is not a column of responses.csv" in r.text
    assert db.exec(select(Study)).all() == []
    r = dclient.post(
        "/admin/import/upload",
        data={**fields, "action": "import"},
        files=_files(folder, "codebook.jsonl"),
    )
    assert r.status_code == 200, r.text
    study = db.exec(select(Study).where(Study.slug == "new-wave")).one()
    items = db.exec(select(Item).where(Item.study_id == study.id)).all()
    assert len(items) == n_items
    assert {it.key for it in items if it.role == "attribute"} == {"birthyr", "gender4"}
    assert db.exec(select(Respondent).where(Respondent.study_id == study.id)).all() == []
    assert dclient.get(f"/admin/studies/{study.slug}").status_code == 200
    # a responses.csv with a header and no rows is the same study without history
    header = (folder / "responses.csv").read_text(encoding="utf-8").splitlines()[0]
    files = _files(folder, "codebook.jsonl")
    files["responses.csv"] = ("responses.csv", (header + "\n").encode(), "text/csv")
    r = dclient.post(
        "/admin/import/upload",
        data={**fields, "name": "Header only", "action": "import"},
        files=files,
    )
    assert r.status_code == 200, r.text
    study = db.exec(select(Study).where(Study.slug == "header-only")).one()
    assert db.exec(select(Respondent).where(Respondent.study_id == study.id)).all() == []


def _study_with_items(dclient: TestClient, name: str = "Edit in place") -> str:
    login(dclient, "alice@example.org")
    r = dclient.post("/admin/studies", data={"name": name, "csrf_token": csrf(dclient)})
    assert r.status_code == 200
    base = r.url.path
    for key, role, options in (
        ("q1", "question", "A: Very satisfied\nB: Somewhat satisfied\nC: Don't know"),
        ("q2", "question", "Yes\nNo"),
        ("q3", "question", "Yes\nNo"),
    ):
        dclient.post(
            base + "/items",
            data={
                "key": key,
                "question": f"Question {key}?",
                "options": options,
                "role": role,
                "csrf_token": csrf(dclient),
            },
        )
    return base


def test_item_edit_in_place_answers_with_the_row_only(
    dclient: TestClient, alice: Researcher, db: Session
) -> None:
    base = _study_with_items(dclient)
    q1 = db.exec(select(Item).where(Item.key == "q1")).one()
    hx = {"HX-Request": "true"}
    # reorder (C first is not a scale, but any order the researcher writes is kept), reword
    # and mark "Don't know" as not an answer; the answer is the row, not the page
    r = dclient.post(
        f"{base}/items/{q1.id}",
        headers=hx,
        data={
            "question": "How satisfied are you?",
            "options": "B: Somewhat satisfied\nA: Very satisfied, really\nC: Don't know",
            "missing": "C",
            "role": "target",
            "csrf_token": csrf(dclient),
        },
    )
    assert r.status_code == 200, r.text
    assert r.text.lstrip().startswith(f'<tr id="item-{q1.id}"') and "<html" not in r.text
    assert "item q1 saved" in r.text and "How satisfied are you?" in r.text
    assert 'id="items-count" hx-swap-oob="true">(3; targets: 1)' in r.text
    db.refresh(q1)
    assert q1.options == [["B", "Somewhat satisfied"], ["A", "Very satisfied, really"]]
    assert q1.role == "target" and q1.question == "How satisfied are you?"
    # an error comes back inside the row (422), the item unchanged
    r = dclient.post(
        f"{base}/items/{q1.id}",
        headers=hx,
        data={"options": "A: only one", "role": "target", "csrf_token": csrf(dclient)},
    )
    assert r.status_code == 422 and 'role="alert"' in r.text and "two options" in r.text
    assert r.text.lstrip().startswith("<tr")
    db.refresh(q1)
    assert len(q1.options) == 2
    # marking all but one option missing is refused
    r = dclient.post(
        f"{base}/items/{q1.id}",
        headers=hx,
        data={"missing": "A", "role": "target", "csrf_token": csrf(dclient)},
    )
    assert r.status_code == 422 and "at least two options must remain" in r.text
    # an unknown action is refused, not read as "save"
    r = dclient.post(
        f"{base}/items/{q1.id}",
        headers=hx,
        data={"action": "explode", "question": "Changed?", "csrf_token": csrf(dclient)},
    )
    assert r.status_code == 422 and "action: &#39;explode&#39; is not save or delete" in r.text
    db.refresh(q1)
    assert q1.question == "How satisfied are you?"
    # a plain (not htmx) post refused: the page shows the stored item, not the edit
    r = dclient.post(
        f"{base}/items/{q1.id}",
        data={"question": "CHANGED WORDING", "role": "bogus", "csrf_token": csrf(dclient)},
    )
    assert r.status_code == 422 and "CHANGED WORDING" not in r.text
    assert "How satisfied are you?" in r.text
    # delete in place: an empty answer removes the row
    q3 = db.exec(select(Item).where(Item.key == "q3")).one()
    r = dclient.post(
        f"{base}/items/{q3.id}", headers=hx, data={"action": "delete", "csrf_token": csrf(dclient)}
    )
    assert r.status_code == 200 and "<tr" not in r.text
    assert 'id="items-count" hx-swap-oob="true">(2; targets: 1)' in r.text
    db.expire_all()
    assert db.exec(select(Item).where(Item.key == "q3")).first() is None


def test_bulk_role_change(dclient: TestClient, alice: Researcher, db: Session) -> None:
    base = _study_with_items(dclient, "Bulk roles")
    r = dclient.post(
        base + "/items/roles",
        headers={"HX-Request": "true"},
        data={"keys": ["q2", "q3"], "role": "target", "csrf_token": csrf(dclient)},
    )
    assert r.status_code == 200 and '<section class="card" id="items"' in r.text
    assert "2 items set to target" in r.text and "<html" not in r.text
    db.expire_all()
    roles = {it.key: it.role for it in db.exec(select(Item)).all()}
    assert roles == {"q1": "question", "q2": "target", "q3": "target"}
    r = dclient.post(
        base + "/items/roles",
        headers={"HX-Request": "true"},
        data={"role": "target", "csrf_token": csrf(dclient)},
    )
    assert r.status_code == 422 and "select at least one item" in r.text
    r = dclient.post(
        base + "/items/roles",
        data={"keys": ["q1"], "role": "boss", "csrf_token": csrf(dclient)},
    )
    assert r.status_code == 422 and "role must be question, attribute or target" in r.text


def test_names_are_validated_not_cut_and_unicode_slugs_read_well(
    dclient: TestClient, alice: Researcher, db: Session
) -> None:
    login(dclient, "alice@example.org")
    r = dclient.post("/admin/studies", data={"name": "x" * 10_000, "csrf_token": csrf(dclient)})
    assert r.status_code == 422
    assert "the study name has 10,000 characters; the limit is 200" in r.text
    assert db.exec(select(Study)).all() == []
    for name, slug in (
        ("Umfrage Größe Zürich", "umfrage-grosse-zurich"),
        ("Опрос доверия 2026", "опрос-доверия-2026"),
        ("信任调查", "信任调查"),
    ):
        r = dclient.post("/admin/studies", data={"name": name, "csrf_token": csrf(dclient)})
        assert r.status_code == 200, r.text
        study = db.exec(select(Study).where(Study.name == name)).one()
        assert study.slug == slug
        assert dclient.get(f"/admin/studies/{slug}").status_code == 200
    base = "/admin/studies/" + "опрос-доверия-2026"
    texts = {"description": "", "consent_text": "", "completion_code": "", "redirect_url": ""}
    r = dclient.post(
        base + "/texts", data={**texts, "name": "y" * 201, "csrf_token": csrf(dclient)}
    )
    assert r.status_code == 422 and "201 characters; the limit is 200" in r.text
    r = dclient.post(
        base + "/texts",
        data={**texts, "name": "ok", "consent_text": "c" * 20_001, "csrf_token": csrf(dclient)},
    )
    assert (
        r.status_code == 422 and "consent text has 20,001 characters; the limit is 20,000" in r.text
    )
    # a name that would display as another (a bidirectional override) or act on a terminal
    for bad, code in (("evil\u202egnp.exe", "U+202E"), ("a\x1b[2Jb", "U+001B")):
        r = dclient.post("/admin/studies", data={"name": bad, "csrf_token": csrf(dclient)})
        assert r.status_code == 422 and "the study name contains" in r.text and code in r.text


def test_only_criteria_the_belief_model_can_run_are_offered_and_accepted(
    dclient: TestClient, alice: Researcher, db: Session
) -> None:
    base = _study_with_items(dclient, "Criteria")
    page = dclient.get(base)
    assert '<option value="irt"' not in page.text and '<option value="eig_anchored"' in page.text
    assert "latent classes (default)" in page.text  # the default named by its family
    assert "What the criteria do" in page.text and "Stop early when" in page.text
    form = {
        "max_questions": "5",
        "min_questions": "0",
        "rounds": "1",
        "respondents_share": "0.5",
        "max_questions_per_respondent": "1",
        "csrf_token": csrf(dclient),
    }
    r = dclient.post(base + "/settings", data={**form, "criterion": "irt"})
    assert r.status_code == 422 and "irt&#39; cannot run with the belief model" in r.text
    r = dclient.post(
        base + "/settings",
        data={**form, "criterion": "posterior_entropy", "belief_model": "cape_linear"},
    )
    assert r.status_code == 422 and "latent_posterior" in r.text
    r = dclient.post(base + "/settings", data={**form, "criterion": "posterior_entropy"})
    assert r.status_code == 200
    r = dclient.post(
        base + "/settings", data={**form, "criterion": "eig", "belief_model": "cape_linear"}
    )
    assert r.status_code == 200
    assert '<option value="posterior_entropy"' not in dclient.get(base).text


def test_preview_without_runs_then_import_the_kept_upload(
    dclient: TestClient,
    alice: Researcher,
    db: Session,
    small_dataset_factory: Callable[..., Path],
) -> None:
    import re

    from app.services import designer

    folder = small_dataset_factory("ces", 25, folder="upload-kept")
    manifest = json.loads((folder / "dataset.json").read_text(encoding="utf-8"))
    manifest["runs"] = "runs.csv"  # named, but not uploaded
    (folder / "dataset.json").write_text(json.dumps(manifest), encoding="utf-8")
    login(dclient, "alice@example.org")
    r = dclient.post(
        "/admin/import/upload",
        data={"action": "preview", "name": "Kept upload", "csrf_token": csrf(dclient)},
        files=_files(folder, "responses.csv", "codebook.jsonl", "dataset.json"),
    )
    assert r.status_code == 200, r.text
    assert "file not found" not in r.text and "runs.csv" in r.text and "left out" in r.text
    token = re.search(r'name="upload_token" value="([^"]+)"', r.text)
    assert token is not None
    kept = designer.uploads_root() / token.group(1)
    assert (kept / "responses.csv").is_file()
    assert db.exec(select(Study)).all() == []
    # import from the preview page: no files chosen again
    r = dclient.post(
        "/admin/import/upload",
        data={
            "action": "import",
            "upload_token": token.group(1),
            "name": "Kept upload",
            "csrf_token": csrf(dclient),
        },
    )
    assert r.status_code == 200, r.text
    study = db.exec(select(Study).where(Study.slug == "kept-upload")).one()
    assert study.owner_id == alice.id
    assert len(db.exec(select(Respondent).where(Respondent.study_id == study.id)).all()) == 25
    assert not kept.exists()  # removed after the import
    again = dclient.post(
        "/admin/import/upload",
        data={"action": "import", "upload_token": token.group(1), "csrf_token": csrf(dclient)},
    )
    assert again.status_code == 422 and "no longer kept" in again.text


def test_files_chosen_together_are_known_by_their_names(
    dclient: TestClient, alice: Researcher, db: Session, small_dataset_factory: Callable[..., Path]
) -> None:
    """One multiple-file field holds the dataset's files; an unknown or repeated name is a
    422 naming the file, and nothing is imported."""
    folder = small_dataset_factory("ces", 20, folder="upload-together")
    login(dclient, "alice@example.org")

    def post(names: list[str], action: str = "import") -> Any:
        paths = {n: folder / n.rsplit("/", 1)[-1] for n in names}
        body = {n: p.read_bytes() if p.exists() else b"notes" for n, p in paths.items()}
        parts = [("files", (n, body[n], "application/octet-stream")) for n in names]
        return dclient.post(
            "/admin/import/upload",
            data={"action": action, "name": "Together", "csrf_token": csrf(dclient)},
            files=parts,
        )

    r = post(["responses.csv", "codebook.jsonl", "notes.txt"])
    assert r.status_code == 422 and "files: &#39;notes.txt&#39; is not one of" in r.text
    r = post(["responses.csv", "codebook.jsonl", "sub/responses.csv"])
    assert r.status_code == 422 and "&#39;responses.csv&#39; chosen twice" in r.text
    assert db.exec(select(Study)).all() == []
    r = post(["responses.csv", "codebook.jsonl", "dataset.json", "user_split.json"], "preview")
    assert r.status_code == 200 and "20 respondents" in r.text
    r = post(["responses.csv", "codebook.jsonl", "dataset.json"])
    assert r.status_code == 200, r.text
    study = db.exec(select(Study).where(Study.slug == "together")).one()
    assert len(db.exec(select(Respondent).where(Respondent.study_id == study.id)).all()) == 20


def test_kept_uploads_belong_to_their_researcher_and_expire(
    alice: Researcher,
    bob: Researcher,
    db: Session,
    small_dataset_factory: Callable[..., Path],
    tmp_path: Path,
) -> None:
    import time

    from app.errors import NotFoundError
    from app.services import designer

    folder = small_dataset_factory("ces", 25, folder="upload-expiry")
    files = {n: (folder / n).read_bytes() for n in ("responses.csv", "codebook.jsonl")}
    root = tmp_path / "uploads"
    preview = designer.preview_upload(files, {"name": "Expiring"}, owner=alice, root=root)
    assert preview.token and (root / preview.token).is_dir()
    with pytest.raises(NotFoundError):
        designer.import_stored_upload(preview.token, owner=bob, session=db, root=root)
    with pytest.raises(NotFoundError):
        designer.import_stored_upload("../../etc", owner=alice, session=db, root=root)
    assert designer.remove_expired_uploads(root) == 0
    later = time.time() + designer.UPLOAD_TTL_S + 1
    assert designer.remove_expired_uploads(root, now=later) == 1
    assert not (root / preview.token).exists()
    # a failed preview keeps nothing, and its message never names the server's folder
    bad = dict(files)
    bad["codebook.jsonl"] = b'{"id": "x"}\n'
    with pytest.raises(Exception) as err:
        designer.preview_upload(bad, {"name": "Broken"}, owner=alice, root=root)
    assert str(root) not in str(err.value)
    assert list(root.iterdir()) == []


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("A: Strongly agree\nB: Agree", [["A", "Strongly agree"], ["B", "Agree"]]),
        ("Y:Yes\nN:No", [["Y", "Yes"], ["N", "No"]]),
        ("A: Other: please specify\nB: No", [["A", "Other: please specify"], ["B", "No"]]),
        (  # a colon in one label among plain labels is part of the label
            "Yes\nNo\nOther: please specify",
            [["A", "Yes"], ["B", "No"], ["C", "Other: please specify"]],
        ),
        ("10:30 am\n11:30 am", [["A", "10:30 am"], ["B", "11:30 am"]]),
    ],
)
def test_option_lines_are_coded_only_when_every_line_is(text: str, want: list) -> None:
    from app.services.designer import parse_options

    assert parse_options(text) == want


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("Yes\nyes", "option label used twice: 'yes'"),
        ("\n".join(f"o{k}" for k in range(101)), "more than 26 options"),
        ("\n".join(f"X{k}: o{k}" for k in range(101)), "101 options: at most 100"),
        ("A: " + "x" * 501 + "\nB: no", "option label of 501 characters: at most 500"),
        ("A: Yes\nNo", "option line 2 \\('No'\\) has no letter code while others have one"),
        ("Yes, a long first label\nB: y", "option line 1 .* has no letter code"),
    ],
)
def test_bad_option_lists_are_refused(text: str, message: str) -> None:
    from app.errors import InvalidInputError
    from app.services.designer import parse_options

    with pytest.raises(InvalidInputError, match=message):
        parse_options(text)


def test_item_texts_have_limits_and_nothing_is_cut(db: Session, alice: Researcher) -> None:
    from app.errors import InvalidInputError
    from app.services.designer import add_item, create_study

    study = create_study("Limits", owner=alice, session=db)
    for kwargs, message in (
        ({"topic": "t" * 201}, "topic: 201 characters, at most 200"),
        ({"question": "q" * 5001}, "question: 5,001 characters, at most 5,000"),
        ({"question": "   "}, "the question text is empty"),
    ):
        args = {"key": "k", "question": "Q?", "options_text": "A\nB", "role": "question",
                **kwargs}  # fmt: skip
        with pytest.raises(InvalidInputError, match=message):
            add_item(study, session=db, **args)
    item = add_item(study, session=db, key="k", question=" Q? ", options_text="A\nB",
                    role="question", topic="t" * 200)  # fmt: skip
    assert (item.question, item.topic) == ("Q?", "t" * 200)


def test_an_answered_study_keeps_its_items_and_says_what_an_edit_changes(
    client: TestClient, ces_study: Study, alice: Researcher, db: Session, engine: Any
) -> None:
    """Once a live respondent answered: an item cannot be deleted nor lose an option
    letter (each refused with the reason, nothing changed); rewording it is allowed and
    the notice says how many earlier answers now show with the new wording."""
    from app import session as svc
    from app.services.belief import fit_study_model

    fit_study_model(ces_study, session=db, n_classes=(2,), n_restarts=1)
    ces_study.status, ces_study.consent_text = "published", "ok"
    db.add(ces_study)
    db.commit()
    started = svc.start_session(ces_study, engine=engine)
    q = started.view.question
    assert q is not None
    svc.submit_answer(
        ces_study, started.session_id, item_key=q.key, option=q.options[0][0],
        idempotency_key=None, engine=engine,
    )  # fmt: skip
    item = db.exec(select(Item).where(Item.study_id == ces_study.id, Item.key == q.key)).one()
    url = f"/admin/studies/{ces_study.slug}/items/{item.id}"
    login(client, "alice@example.org")
    r = client.post(url, data={"action": "delete", "csrf_token": csrf(client)})
    assert r.status_code == 409 and "items cannot be deleted" in r.text
    renamed = [*item.options[:-1], ["Z", item.options[-1][1]]]  # drops the last letter
    text = "\n".join(f"{o[0]}: {o[1]}" for o in renamed)
    r = client.post(url, data={"options": text, "csrf_token": csrf(client)})
    assert r.status_code == 409 and "option letters cannot be removed" in r.text
    db.expire_all()
    assert db.get(Item, item.id).options == item.options  # type: ignore[union-attr]
    r = client.post(url, data={"question": "Reworded?", "csrf_token": csrf(client)})
    assert r.status_code == 200, r.text
    assert f"item {q.key} saved; its 1 earlier answer (kept by option letter)" in r.text
    r = client.post(url, data={"question": "Reworded?", "csrf_token": csrf(client)})
    assert f"item {q.key} saved" in r.text and "earlier answer" not in r.text  # no change


def test_the_round_question_cap_says_what_it_counts_and_refuses_less_than_used(
    client: TestClient,
    engine: Any,
    db: Session,
    settings: Settings,
    ces_study: Study,
    alice: Researcher,
) -> None:
    """ "Total questions asked across rounds" (the stored ``group.total_answers``) counts
    the members invited to rounds, answered or not: a new value below what the rounds
    asked is refused (422, the field named, nothing stored); the form, the rounds page and
    the open's refusal say what it counts."""
    from tests.support.group_round import group_study, open_test_round

    study = group_study(db, ces_study, rounds=3, respondents_per_round=4, total_answers=50)
    open_test_round(engine, settings, study)  # 4 members invited, none answered
    login(client, "alice@example.org")
    base = f"/admin/studies/{study.slug}"
    page = client.get(base).text
    assert "Total questions asked across rounds (members invited)" in page
    assert "every member invited to a round counts once, whether they answer or not" in page
    assert "Total answers" not in page
    assert "answered the survey" not in page  # the Panel help says who can be asked
    assert "those who answered at least one survey question and can be reached" in page
    groups = client.get(base + "/groups/1").text
    assert "questions asked in all rounds (members invited, answered or not)" in groups
    form = {
        "criterion": study.settings["criterion"],
        "max_questions": "3",
        "min_questions": "1",
        "rounds": "3",
        "respondents_per_round": "4",
        "max_questions_per_respondent": "1",
        "csrf_token": csrf(client),
    }
    low = client.post(base + "/settings", data={**form, "total_answers": "3"})
    assert low.status_code == 422
    assert (
        "Total questions asked across rounds (members invited): 3 is less than the 4 round "
        "questions already asked (members invited, answered or not); enter at least 4"
    ) in low.text
    db.refresh(study)
    assert study.settings["group"]["total_answers"] == 50
    for ok in ("4", "", "50"):  # the rounds' count, no cap, a larger cap
        r = client.post(base + "/settings", data={**form, "total_answers": ok})
        assert r.status_code == 200, r.text
        db.refresh(study)
        assert study.settings["group"]["total_answers"] == (int(ok) if ok else None)
    # the dashboard counts the same (not the survey's answers)
    dash = client.get(base + "/dashboard").text
    assert "4 / 50</span> group round questions asked (members invited" in dash
    # a stored cap already passed is kept when the form sends it unchanged (other edits)
    study.settings = {**study.settings, "group": {**study.settings["group"], "total_answers": 2}}
    db.add(study)
    db.commit()
    assert client.post(base + "/settings", data={**form, "total_answers": "2"}).status_code == 200


def test_the_respondent_language_round_trips_and_an_unknown_one_is_refused(
    dclient: TestClient, alice: Researcher, db: Session
) -> None:
    base = _study_with_items(dclient, "Sprache")
    study = db.exec(select(Study).where(Study.slug == "sprache")).one()
    assert study.settings["language"] == "en"  # a new study's
    page = dclient.get(base).text
    assert "Language of the respondent pages" in page
    assert '<option value="en" selected>English (en)</option>' in page
    assert '<option value="de" >Deutsch (de)</option>' in page
    form = {
        "criterion": "eig",
        "max_questions": "5",
        "min_questions": "0",
        "rounds": "1",
        "respondents_share": "0.5",
        "max_questions_per_respondent": "1",
        "csrf_token": csrf(dclient),
    }
    r = dclient.post(base + "/settings", data={**form, "language": "de"})
    assert r.status_code == 200
    db.refresh(study)
    assert study.settings["language"] == "de"
    assert '<option value="de" selected>Deutsch (de)</option>' in dclient.get(base).text
    # a form without the field keeps the stored language
    r = dclient.post(base + "/settings", data={**form, "max_questions": "6"})
    assert r.status_code == 200
    db.refresh(study)
    assert study.settings["language"] == "de" and study.settings["budgets"]["max_questions"] == 6
    # an unknown language: 422 naming the field, and nothing of the form is stored
    r = dclient.post(base + "/settings", data={**form, "max_questions": "7", "language": "xx"})
    assert r.status_code == 422
    assert (
        "Language of the respondent pages: unknown language 'xx' (supported: en (English), "
        "de (Deutsch), fr (Français), es (Español))" in html.unescape(r.text)
    )
    db.expire_all()
    study = db.exec(select(Study).where(Study.slug == "sprache")).one()
    assert study.settings["language"] == "de" and study.settings["budgets"]["max_questions"] == 6
