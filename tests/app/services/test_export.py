"""Exports read back (pandas for CSV, pyreadstat for .sav/.dta) equal the stored answers,
cell by cell, with variable and value labels; through the admin routes (streamed)."""

from __future__ import annotations

import io
import json
import re
import secrets
from pathlib import Path
from typing import Any

import pandas as pd
import pyreadstat
import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from app.errors import InvalidInputError
from app.services.designer import add_item, create_study
from app.services.export import SKIP_CODE, SKIP_MARK, STATA_SKIP, variable_names
from app.tables import (
    Answer,
    ElicitationSession,
    FittedModel,
    Item,
    Researcher,
    Respondent,
    SelectionDecision,
    Study,
)
from tests.support.admin import csrf, login

LONG_QUESTION = "Wie zufrieden sind Sie — ganz allgemein — mit «Demokratie» in Ihrem Land? " * 3


def _live_session(db: Session, study: Study, **respondent: Any) -> ElicitationSession:
    """A live respondent of ``study`` (``respondent``: its fields) with one session."""
    resp = Respondent(study_id=study.id or 0, **respondent)
    db.add(resp)
    db.flush()
    sess = ElicitationSession(
        study_id=study.id or 0, respondent_id=resp.id or 0, token_hash=secrets.token_hex(16)
    )
    db.add(sess)
    db.flush()
    return sess


@pytest.fixture
def live_study(db: Session, alice: Researcher) -> tuple[Study, dict[str, dict[str, str]]]:
    """A study with 3 items and 4 live respondents (answers, a skip, an unasked item)."""
    study = create_study("Export test", owner=alice, session=db)
    add_item(
        study,
        session=db,
        key="age",
        question="Age group",
        options_text="A: 18–34\nB: 35+",
        role="attribute",
    )
    add_item(
        study,
        session=db,
        key="1q",
        question=LONG_QUESTION,
        options_text="sehr\netwas\ngar nicht",
        role="question",
    )
    add_item(
        study,
        session=db,
        key="vote",
        question='Vote "yes"?',
        options_text="Y: Ja, natürlich\nN: Nein",
        role="target",
    )
    items = {it.key: it for it in db.exec(select(Item).where(Item.study_id == study.id)).all()}
    plan = {
        "p1": {"age": "A", "1q": "B", "vote": "Y"},
        "p2": {"age": "B", "1q": SKIP_MARK, "vote": "N"},
        "p3": {"age": "A", "vote": "N"},
        "p4 ü": {"age": "B"},
    }
    for ext, cells in plan.items():
        sess = _live_session(db, study, external_id=ext, attributes={"age": cells["age"]})
        for key, value in cells.items():
            if key == "age":
                continue
            db.add(
                Answer(
                    session_id=sess.id or 0,
                    item_id=items[key].id or 0,
                    option=None if value == SKIP_MARK else value,
                )
            )
    db.commit()
    return study, plan


def _get(client: TestClient, study: Study, name: str) -> bytes:
    r = client.get(f"/admin/studies/{study.slug}/export/{name}")
    assert r.status_code == 200, r.text
    return r.content


def test_csv_wide_and_long_equal_stored_answers(
    client: TestClient, live_study, db: Session
) -> None:  # type: ignore[no-untyped-def]
    study, plan = live_study
    login(client, "alice@example.org")
    raw = _get(client, study, "answers_wide.csv")
    assert raw.startswith("\ufeff".encode())
    wide = pd.read_csv(io.BytesIO(raw), encoding="utf-8-sig", dtype=str, keep_default_na=False)
    assert list(wide.columns[-3:]) == ["age", "1q", "vote"]
    assert len(wide) == len(plan)
    for _, row in wide.iterrows():
        cells = plan[row["respondent_id"]]
        for key in ("age", "1q", "vote"):
            assert row[key] == cells.get(key, ""), (row["respondent_id"], key)

    long = pd.read_csv(
        io.BytesIO(_get(client, study, "answers_long.csv")),
        encoding="utf-8-sig",
        dtype=str,
        keep_default_na=False,
    )
    stored = db.exec(select(Answer).order_by(Answer.id)).all()  # type: ignore[arg-type]
    demographics = long[long["role"] == "attribute"]
    answers = long[long["role"] != "attribute"]
    assert len(answers) == len(stored) == sum(len(c) - 1 for c in plan.values())
    for (_, row), a in zip(answers.iterrows(), stored, strict=True):
        assert row["option"] == (a.option if a.option is not None else SKIP_MARK)
        assert plan[row["respondent_id"]][row["item"]] == row["option"]
    assert sorted(
        zip(demographics["respondent_id"], demographics["option"], strict=True)
    ) == sorted((ext, cells["age"]) for ext, cells in plan.items())
    assert set(demographics[demographics["option"] == "A"]["option_label"]) == {"18–34"}
    q = long[long["item"] == "1q"].iloc[0]
    assert q["question"] == LONG_QUESTION.strip() and q["option_label"] == "etwas"


def _export_frames(client: TestClient, study: Study) -> tuple[pd.DataFrame, pd.DataFrame]:
    def read(name: str) -> pd.DataFrame:
        raw = _get(client, study, name)
        return pd.read_csv(io.BytesIO(raw), encoding="utf-8-sig", dtype=str, keep_default_na=False)

    return read("answers_wide.csv"), read("answers_long.csv")


def test_two_sessions_are_one_row_and_a_declined_demographic_is_skip(
    client: TestClient, live_study, db: Session, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """A respondent who answered the survey and then a group round (a second session) is
    one wide row holding both sessions' answers; a respondent who went through the
    attribute step without answering "age" has ``<skip>`` for it in the wide and the long
    CSV (documented), and every demographic is in the long CSV."""
    study, plan = live_study
    items = {it.key: it for it in db.exec(select(Item).where(Item.study_id == study.id)).all()}
    p3 = db.exec(select(Respondent).where(Respondent.external_id == "p3")).one()
    first = db.exec(
        select(ElicitationSession).where(ElicitationSession.respondent_id == p3.id)
    ).one()
    # the group round: a second session of p3 answering the item p3 was never asked
    rnd = ElicitationSession(
        study_id=study.id or 0, respondent_id=p3.id or 0, token_hash=secrets.token_hex(16)
    )
    db.add(rnd)
    db.flush()
    db.add(Answer(session_id=rnd.id or 0, item_id=items["1q"].id or 0, option="C"))
    # p5 declined the demographic: past the attribute step (first decision), no "age"
    s5 = _live_session(db, study, external_id="p5", attributes={})
    db.add(
        SelectionDecision(
            session_id=s5.id or 0, position=0, item_id=items["vote"].id, criterion="eig"
        )
    )
    db.add(Answer(session_id=s5.id or 0, item_id=items["vote"].id or 0, option="Y"))
    db.commit()
    login(client, "alice@example.org")
    wide, long = _export_frames(client, study)

    assert wide["respondent_id"].is_unique and len(wide) == len(plan) + 1
    row = wide[wide["respondent_id"] == "p3"].iloc[0]
    assert (row["age"], row["1q"], row["vote"]) == ("A", "C", "N")
    assert row["session_id"] == str(first.id)  # the survey's session, not the round's
    row = wide[wide["respondent_id"] == "p5"].iloc[0]
    assert (row["age"], row["1q"], row["vote"]) == (SKIP_MARK, "", "Y")
    # respondents of the fixture did not reach an attribute step: nothing is invented
    assert (wide[wide["respondent_id"] != "p5"]["age"] != SKIP_MARK).all()

    mine = long[long["respondent_id"] == "p5"]
    assert list(zip(mine["item"], mine["role"], mine["option"], strict=True)) == [
        ("age", "attribute", SKIP_MARK),
        ("vote", "target", "Y"),
    ]
    p3_rows = long[long["respondent_id"] == "p3"]
    assert list(p3_rows["item"]) == ["age", "vote", "1q"]
    assert p3_rows.iloc[-1]["session_id"] == str(rnd.id)

    path = tmp_path / "answers.sav"
    path.write_bytes(_get(client, study, "answers.sav"))
    frame, _meta = pyreadstat.read_sav(str(path), user_missing=True)
    assert frame["respondent_id"].is_unique and len(frame) == len(plan) + 1
    (age,) = variable_names(["age"])
    assert frame.loc[frame["respondent_id"] == "p5", age].tolist() == [SKIP_CODE]


@pytest.mark.parametrize("fmt", ["sav", "dta"])
def test_spss_and_stata_equal_stored_answers_with_labels(
    client: TestClient,
    live_study,
    tmp_path: Path,
    fmt: str,  # type: ignore[no-untyped-def]
) -> None:
    study, plan = live_study
    login(client, "alice@example.org")
    path = tmp_path / f"a.{fmt}"
    path.write_bytes(_get(client, study, f"answers.{fmt}"))
    reader = pyreadstat.read_sav if fmt == "sav" else pyreadstat.read_dta
    frame, meta = reader(str(path), user_missing=True)
    skip = SKIP_CODE if fmt == "sav" else STATA_SKIP  # Stata: the extended missing .a
    keys = ["age", "1q", "vote"]
    names = dict(zip(keys, variable_names(keys), strict=True))
    assert names == {"age": "age", "1q": "q_1q", "vote": "vote"}
    codes = {"age": ["A", "B"], "1q": ["A", "B", "C"], "vote": ["Y", "N"]}
    assert len(frame) == len(plan)
    for _, row in frame.iterrows():
        cells = plan[row["respondent_id"]]
        for key, name in names.items():
            value = row[name]
            want = cells.get(key)
            if want is None:
                assert pd.isna(value), (row["respondent_id"], key)
            elif want == SKIP_MARK:
                assert value == skip
            else:
                assert value == codes[key].index(want) + 1, (row["respondent_id"], key, value)
    if fmt == "sav":  # whole-number codes, measure levels
        assert meta.original_variable_types["vote"] == "F8.0"
        assert meta.original_variable_types["session_id"] == "F8.0"
        assert meta.variable_measure["vote"] == "ordinal"
        assert meta.variable_measure["respondent_id"] == "nominal"
        assert meta.variable_measure["earlier_starts"] == "scale"
    labels = meta.column_names_to_labels
    limit = 80 if fmt == "dta" else 10_000
    full = f"1q: {LONG_QUESTION.strip()}"
    assert labels["q_1q"] == (full if len(full) <= limit else full[: limit - 1] + "…")
    assert labels["vote"] == 'vote: Vote "yes"?'
    vl = meta.variable_value_labels
    assert vl["vote"] == {1: "Y: Ja, natürlich", 2: "N: Nein", skip: "skipped"}
    assert vl["q_1q"][2] == "B: etwas"
    # read as a statistics package counts: a skip is missing, never the number -1
    plain, _ = reader(str(path))
    skipped = [
        (row["respondent_id"], name)
        for _, row in frame.iterrows()
        for key, name in names.items()
        if plan[row["respondent_id"]].get(key) == SKIP_MARK
    ]
    assert skipped
    if fmt == "dta":
        for rid, name in skipped:
            assert pd.isna(plain.loc[plain["respondent_id"] == rid, name].item())


@pytest.mark.parametrize("fmt", ["sav", "dta"])
def test_spss_and_stata_of_a_study_without_respondents(
    client: TestClient, db: Session, alice: Researcher, tmp_path: Path, fmt: str
) -> None:
    """A study with items but no respondent exports an empty, typed, labelled file."""
    study = create_study("Empty export", owner=alice, session=db)
    add_item(study, session=db, key="age", question="Age", options_text="A\nB", role="attribute")
    add_item(study, session=db, key="vote", question="Vote?", options_text="Y\nN", role="target")
    login(client, "alice@example.org")
    path = tmp_path / f"e.{fmt}"
    path.write_bytes(_get(client, study, f"answers.{fmt}"))
    frame, meta = (pyreadstat.read_sav if fmt == "sav" else pyreadstat.read_dta)(str(path))
    assert len(frame) == 0 and {"respondent_id", "age", "vote"} <= set(frame.columns)
    assert meta.variable_value_labels["vote"][1] == "A: Y"  # codes A, B; labels Y, N


@pytest.mark.parametrize("fmt", ["sav", "dta"])
def test_an_item_named_like_a_link_parameter_column_gets_its_own_variable(
    client: TestClient, db: Session, alice: Researcher, tmp_path: Path, fmt: str
) -> None:
    """An item keyed like a link parameter's column (an imported survey's ``panel.K``)
    beside the link parameter ``K``: two variables (``panel_K``, ``panel_K_2``), each
    with its label, and the item's answers under the second (this used to be a 500)."""
    study = create_study("Clash export", owner=alice, session=db)
    add_item(study, session=db, key="vote", question="Vote?", options_text="Y\nN", role="target")
    clash = Item(study_id=study.id or 0, key="panel.K", question="K?", options=[["A", "a"],
                 ["B", "b"]], role="question", position=1)  # fmt: skip
    db.add(clash)
    sess = _live_session(db, study, external_id="x1", panel_params={"K": "from-link"})
    db.add(Answer(session_id=sess.id or 0, item_id=clash.id or 0, option="B"))
    db.commit()
    login(client, "alice@example.org")
    path = tmp_path / f"c.{fmt}"
    path.write_bytes(_get(client, study, f"answers.{fmt}"))
    frame, meta = (pyreadstat.read_sav if fmt == "sav" else pyreadstat.read_dta)(str(path))
    assert frame["panel_K"].tolist() == ["from-link"]
    assert frame["panel_K_2"].tolist() == [2.0]
    labels = meta.column_names_to_labels
    assert (labels["panel_K"], labels["panel_K_2"]) == ("link parameter K", "panel.K: K?")


def test_variable_names_are_unique_without_case_and_positional() -> None:
    keys = ["327a", "a-b", "a_b", "A_B", "status", "panel.K", "panel.K", "x" * 40]
    assert variable_names(keys) == [
        "q_327a", "a_b", "a_b_2", "A_B_3", "status_2", "panel_K", "panel_K_2", "x" * 28,
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("status", "'status' is the name of an export column"),
        ("respondent_id", "'respondent_id' is the name of an export column"),
        ("panel.PROLIFIC_PID", "starts with 'panel.'"),
        ("q1__pred", "ends with '__pred'"),
        ("q1__p", "ends with '__p'"),
    ],
)
def test_item_keys_an_export_column_has_are_refused(
    db: Session, alice: Researcher, key: str, message: str
) -> None:
    study = create_study(f"Reserved {key}", owner=alice, session=db)
    with pytest.raises(InvalidInputError, match=re.escape(message)):
        add_item(study, session=db, key=key, question="Q?", options_text="A\nB", role="question")
    add_item(study, session=db, key="status_q", question="Q?", options_text="A\nB", role="question")


def test_imported_on_a_file_without_imported_respondents_is_refused(
    client: TestClient, live_study
) -> None:  # type: ignore[no-untyped-def]
    study, _ = live_study
    login(client, "alice@example.org")
    r = client.get(f"/admin/studies/{study.slug}/export/answers_long.csv?imported=1")
    assert r.status_code == 422 and "only answers.dta, answers.sav, answers_wide.csv" in r.text


def test_codebook_jsonl_roundtrip(client: TestClient, live_study) -> None:  # type: ignore[no-untyped-def]
    study, _ = live_study
    login(client, "alice@example.org")
    lines = _get(client, study, "codebook.jsonl").decode("utf-8").splitlines()
    items = [json.loads(line) for line in lines]
    assert [i["id"] for i in items] == ["age", "1q", "vote"]
    assert items[1]["options"] == {"A": "sehr", "B": "etwas", "C": "gar nicht"}
    assert items[2]["role"] == "target" and items[2]["question"] == 'Vote "yes"?'


def test_export_of_unknown_name_is_404(client: TestClient, live_study) -> None:  # type: ignore[no-untyped-def]
    study, _ = live_study
    login(client, "alice@example.org")
    assert client.get(f"/admin/studies/{study.slug}/export/passwords.csv").status_code == 404


def test_predictions_csv_equals_replayed_predictions(
    client: TestClient, ces_study: Study, db: Session, engine
) -> None:  # type: ignore[no-untyped-def]
    """Per-respondent predictions equal the live loop's own predictions for each session."""
    from app import session as svc
    from app.services.belief import fit_study_model

    fit_study_model(ces_study, session=db, n_classes=(2,), n_restarts=1)
    ces_study.status = "published"
    db.add(ces_study)
    db.commit()
    started = []
    for r in range(3):
        s = svc.start_session(ces_study, engine=engine)
        view = s.view
        for _ in range(r):
            assert view.question is not None
            view = svc.submit_answer(
                ces_study,
                s.session_id,
                item_key=view.question.key,
                option=view.question.options[0][0],
                idempotency_key=None,
                engine=engine,
            )
        started.append(s.session_id)
    login(client, "alice@example.org")
    frame = pd.read_csv(
        io.BytesIO(_get(client, ces_study, "predictions.csv")),
        encoding="utf-8-sig",
        dtype={"option": str},
    )
    assert sorted(set(frame["session_id"])) == started
    for sid in started:
        sess = db.get(ElicitationSession, sid)
        assert sess is not None
        want = svc.predictions(ces_study, sess, session=db).targets
        rows = frame[frame["session_id"] == sid]
        assert set(rows["target"]) == {p.item for p in want} and len(want) == 5
        for p in want:
            got = rows[rows["target"] == p.item].set_index("option")["probability"].to_dict()
            assert got == pytest.approx(p.distribution, abs=1e-6)
            best = max(p.distribution, key=lambda k: p.distribution[k])
            assert rows[(rows["target"] == p.item) & (rows["predicted"] == 1)][
                "option"
            ].tolist() == [best]


# ----- getting a study out: survey link, QR code, preview (not counted) ----------------------


def test_studies_list_shares_the_survey_and_a_preview_is_not_counted(
    settings, small_dataset: Path
) -> None:  # type: ignore[no-untyped-def]
    """The studies list shows the published study's survey link (copy button), its QR
    code (an SVG from this server) and "preview as respondent"; the preview runs the real
    survey pages but appears in no export, dashboard count or respondent count."""
    from app.auth import create_account
    from app.main import create_app
    from app.services.dashboard import build_dashboard
    from app.services.studies import list_study_summaries
    from tests.support.live_study import make_live_study

    live = make_live_study(settings.database_url, small_dataset)
    with Session(live.engine) as s:
        create_account("boss@example.org", "boss password 123", session=s, is_admin=True)
    try:
        with TestClient(create_app(settings), base_url="http://localhost") as client:
            login(client, "boss@example.org", "boss password 123")
            home = client.get("/admin")
            survey = f"http://localhost/s/{live.slug}"
            row = home.text.split(f'<tr data-slug="{live.slug}">')[1].split("</tr>")[0]
            assert f'value="{survey}"' in row and f'data-copy="{survey}"' in row
            assert f'src="http://localhost/admin/studies/{live.slug}/qr.svg"' in row
            assert "Preview as respondent" in row

            qr = client.get(f"/admin/studies/{live.slug}/qr.svg")
            assert qr.status_code == 200 and qr.headers["content-type"] == "image/svg+xml"
            assert qr.text.startswith("<svg") and f"<title>{survey}</title>" in qr.text
            assert "http" not in qr.text.replace(survey, "").replace(
                "http://www.w3.org/2000/svg", ""
            )  # nothing loaded from elsewhere

            r = client.post(
                f"/admin/studies/{live.slug}/preview",
                data={"csrf_token": csrf(client)},
                follow_redirects=False,
            )
            assert r.status_code == 303 and f"/s/{live.slug}/resume/" in r.headers["location"]
            page = client.get(r.headers["location"], follow_redirects=True)
            assert page.status_code == 200 and page.url.path == f"/s/{live.slug}/q"
            assert "Preview — answers are not counted" in page.text

            with Session(live.engine) as s:
                preview = s.exec(select(ElicitationSession)).one()
                assert preview.is_preview
                study = s.exec(select(Study).where(Study.id == live.study_id)).one()
                counts = build_dashboard(study, session=s).counts
                assert counts == {
                    "started": 0,
                    "completed": 0,
                    "in_progress": 0,
                    "dropped": 0,
                    "declined": 0,
                    "live_respondents": 0,
                    "repeated_starts": 0,
                    "imported": 30,
                    "erased": 0,
                }
                summary = [x for x in list_study_summaries(session=s) if x.slug == live.slug]
                assert summary[0].n_respondents == 30  # the imported ones only
            wide = pd.read_csv(
                io.BytesIO(_get(client, study, "answers_wide.csv")), encoding="utf-8-sig"
            )
            assert len(wide) == 0
    finally:
        live.engine.dispose()


def test_preview_needs_a_published_study_with_a_model(
    client: TestClient, live_study, db: Session
) -> None:  # type: ignore[no-untyped-def]
    study, _plan = live_study
    login(client, "alice@example.org")
    home = client.get("/admin")
    assert "publish it to share the link" in home.text
    r = client.post(f"/admin/studies/{study.slug}/preview", data={"csrf_token": csrf(client)})
    assert r.status_code == 409 and "publish the study to preview" in r.text
    # published without a model: no fit inside the request, no session
    study.status = "published"
    db.add(study)
    db.commit()
    r = client.post(f"/admin/studies/{study.slug}/preview", data={"csrf_token": csrf(client)})
    assert r.status_code == 409 and "no fitted model yet" in r.text
    assert len(db.exec(select(ElicitationSession)).all()) == len(_plan)
    assert db.exec(select(FittedModel)).all() == []
