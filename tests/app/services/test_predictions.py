"""Predicted answers for every unanswered item (app/services/predictions.py) against the
exact posterior of a 2-class, 3-binary-item model computed by hand, and the exports that
carry them (wide and long CSV, ``predictions=1``) on SQLite and PostgreSQL."""

from __future__ import annotations

import io

import pandas as pd
import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from app.services import export
from app.services.predictions import (
    ANSWERED,
    NOT_ASKED,
    SKIPPED,
    Evidence,
    ModelSet,
    predict_respondents,
    session_models,
)
from app.services.profile import session_profile
from app.tables import Answer, ElicitationSession, Item, Researcher
from tests.support.admin import login
from tests.support.tiny_model import NEW, OLD, TinyStudy, by_hand, make_tiny_study


@pytest.fixture
def tiny(db: Session, alice: Researcher) -> TinyStudy:
    return make_tiny_study(db, alice)


def test_hand_computed_posterior() -> None:
    """The helper itself: x = B, a = A under OLD gives w = (2/11, 9/11)."""
    p = by_hand(OLD, {"x": "B", "a": "A"})
    assert p["t"] == pytest.approx(2 / 11 * 0.7 + 9 / 11 * 0.1)


def test_predictions_equal_the_exact_posterior(tiny: TinyStudy, db: Session) -> None:
    evidence = [
        Evidence(1, {"x": "B"}, [("a", "A")], model_id=tiny.old_id),
        Evidence(2, {}, (), frozenset({"x", "a"}), model_id=tiny.old_id),
        Evidence(3, {}, [("a", "B")]),  # no recorded model: the active one
        Evidence(4, {}, [("t", "A")], model_id=987654),  # not a model of the study: active
    ]
    got = predict_respondents(tiny.study, evidence, session=db)
    assert [g.respondent_pk for g in got] == [1, 2, 3, 4]
    assert [(g.model_id, g.model_from_session) for g in got] == [
        (tiny.old_id, True),
        (tiny.old_id, True),
        (tiny.new_id, False),
        (tiny.new_id, False),
    ]
    for g, spec, ev in zip(got, (OLD, OLD, NEW, NEW), evidence, strict=True):
        want = by_hand(spec, dict(ev.observed))
        assert [p.key for p in g.items] == ["x", "a", "t"]
        for p in g.items:
            assert p.probabilities == pytest.approx((want[p.key], 1 - want[p.key]), abs=1e-12)
            assert p.letter == ("A" if want[p.key] >= 0.5 else "B")
            assert p.probability == pytest.approx(max(want[p.key], 1 - want[p.key]), abs=1e-12)
        assert g.n_observed == len(ev.observed)
    # r1: x = B and a = A answered; t = B predicted with 1 - 2.3/11
    r1 = got[0]
    assert [(p.key, p.status) for p in r1.items] == [
        ("x", ANSWERED),
        ("a", ANSWERED),
        ("t", NOT_ASKED),
    ]
    assert [p.key for p in r1.unanswered] == ["t"]
    assert r1.unanswered[0].label == "no"
    assert r1.unanswered[0].probability == pytest.approx(1 - 2.3 / 11, abs=1e-12)
    assert [p.status for p in got[1].items] == [SKIPPED, SKIPPED, NOT_ASKED]
    # personas: the posterior weights, largest first
    assert [w["weight"] for w in r1.personas] == pytest.approx([9 / 11, 2 / 11], abs=1e-12)
    assert [w["persona"] for w in r1.personas] == [1, 0]


def test_session_models_are_the_newest_decisions_model(tiny: TinyStudy, db: Session) -> None:
    ids = tiny.respondents
    got = session_models(ids.values(), session=db)
    # r3 has no decision, r4's decisions are a preview's, h1 has no session
    assert got == {ids["r1"]: tiny.old_id, ids["r2"]: tiny.old_id}
    assert ModelSet(tiny.study, session=db).active.model_id == tiny.new_id


@pytest.mark.parametrize("status", ["completed", "abandoned"])
def test_a_finished_respondent_is_predicted_by_the_active_model(
    tiny: TinyStudy, db: Session, status: str
) -> None:
    """r1 answered under the old model; once their session is no longer in progress the
    exports predict them with the active (new) model."""
    sess = db.get(ElicitationSession, tiny.sessions["r1"])
    assert sess is not None
    sess.status = status
    db.add(sess)
    db.commit()
    ids = tiny.respondents
    assert session_models(ids.values(), session=db) == {ids["r2"]: tiny.old_id}
    row, result = next(export.predicted_rows(tiny.study, session=db, only=ids["r1"]))
    assert (result.model_id, result.model_from_session) == (tiny.new_id, False)
    want = by_hand(NEW, {"x": "B", "a": "A"})["t"]
    assert result.get("t").probabilities == pytest.approx((want, 1 - want), abs=1e-12)


@pytest.mark.parametrize("status", ["active", "completed"])
def test_the_profile_uses_the_model_of_the_predictions(
    tiny: TinyStudy, db: Session, status: str
) -> None:
    """The API profile's items and its ``predicted`` list come from one model: r1's
    session's (old) model while it is in progress, the active (new) one once finished."""
    sess = db.get(ElicitationSession, tiny.sessions["r1"])
    assert sess is not None
    sess.status = status
    db.add(sess)
    db.commit()
    prof = session_profile(tiny.study, sess, session=db)
    want = by_hand(OLD if status == "active" else NEW, {"x": "B", "a": "A"})["t"]
    (t,) = [e for e in prof["items"] if e["item"] == "t"]
    assert t["distribution"] == pytest.approx([want, 1 - want], abs=1e-12)
    (pred,) = prof["predicted"]
    assert pred["item"] == "t" and pred["probability"] == pytest.approx(max(want, 1 - want))


def _csv(raw: str | bytes) -> pd.DataFrame:
    data = raw.encode() if isinstance(raw, str) else raw
    return pd.read_csv(io.BytesIO(data), encoding="utf-8-sig", dtype=str, keep_default_na=False)


def test_wide_export_with_predictions(tiny: TinyStudy, db: Session) -> None:
    wide = _csv("".join(export.csv_wide(tiny.study, session=db, predictions=True)))
    assert list(wide.columns) == [
        *export.META_COLUMNS,
        "x",
        "a",
        "t",
        "x__pred",
        "x__p",
        "a__pred",
        "a__p",
        "t__pred",
        "t__p",
    ]
    rows = wide.set_index("respondent_id")
    assert list(rows.index) == ["r1", "r2", "r3"]  # the preview r4 is never exported
    assert rows.loc["r1", "earlier_starts"] == "2" and rows.loc["r2", "earlier_starts"] == "0"
    # r1 (old model): x, a answered -> no prediction; t predicted
    assert (rows.loc["r1", "x"], rows.loc["r1", "a"], rows.loc["r1", "t"]) == ("B", "A", "")
    assert rows.loc["r1", ["x__pred", "x__p", "a__pred", "a__p"]].tolist() == ["", "", "", ""]
    assert rows.loc["r1", "t__pred"] == "B"
    assert float(rows.loc["r1", "t__p"]) == pytest.approx(1 - 2.3 / 11, abs=1e-6)
    # r2 (old model): x declined, a skipped: all three predicted from the prior
    prior = by_hand(OLD, {})
    assert (rows.loc["r2", "x"], rows.loc["r2", "a"]) == (export.SKIP_MARK, export.SKIP_MARK)
    for key in ("x", "a", "t"):
        p = prior[key]
        assert rows.loc["r2", f"{key}__pred"] == ("A" if p >= 0.5 else "B")
        assert float(rows.loc["r2", f"{key}__p"]) == pytest.approx(max(p, 1 - p), abs=1e-6)
    # r3 (no decision recorded): the active model's prior
    new_prior = by_hand(NEW, {})
    assert float(rows.loc["r3", "t__p"]) == pytest.approx(new_prior["t"], abs=1e-6)
    assert rows.loc["r3", "t__pred"] == "A"

    # imported h1 (x = A, a = B): the active model given their answers
    with_hist = _csv(
        "".join(export.csv_wide(tiny.study, session=db, include_imported=True, predictions=True))
    ).set_index("respondent_id")
    assert list(with_hist.index) == ["r1", "r2", "r3", "h1"]
    want = by_hand(NEW, {"x": "A", "a": "B"})["t"]
    assert with_hist.loc["h1", "t__pred"] == ("A" if want >= 0.5 else "B")
    assert float(with_hist.loc["h1", "t__p"]) == pytest.approx(max(want, 1 - want), abs=1e-6)
    assert with_hist.loc["h1", "a__pred"] == ""

    # without predictions: the plain columns only, same cells
    plain = _csv("".join(export.csv_wide(tiny.study, session=db)))
    assert list(plain.columns) == [*export.META_COLUMNS, "x", "a", "t"]
    assert plain.to_dict("records") == wide[list(plain.columns)].to_dict("records")


def test_predictions_csv_has_no_preview_and_the_same_numbers(tiny: TinyStudy, db: Session) -> None:
    rows = _csv("".join(export.csv_predictions(tiny.study, session=db)))
    assert sorted(set(rows["respondent_id"])) == ["r1", "r2", "r3"]
    r1 = rows[(rows["respondent_id"] == "r1")].set_index("option")
    assert float(r1.loc["B", "probability"]) == pytest.approx(1 - 2.3 / 11, abs=1e-6)
    assert r1.loc["B", "predicted"] == "1" and r1.loc["A", "predicted"] == "0"
    assert set(r1["target_status"]) == {NOT_ASKED} and set(r1["answer"]) == {""}
    assert set(r1["model_id"]) == {str(tiny.old_id)}  # r1's session is in progress
    r3 = rows[rows["respondent_id"] == "r3"]
    assert set(r3["model_id"]) == {str(tiny.new_id)}


def test_predictions_csv_names_an_answered_targets_answer(tiny: TinyStudy, db: Session) -> None:
    """r3 answers the target t = B: its rows say so beside the model's numbers, which are
    the posterior predictive given t = B (a point mass is not what the model says)."""
    t = db.exec(select(Item).where(Item.study_id == tiny.study.id, Item.key == "t")).one()
    db.add(Answer(session_id=tiny.sessions["r3"], item_id=t.id or 0, option="B"))
    db.commit()
    rows = _csv("".join(export.csv_predictions(tiny.study, session=db)))
    r3 = rows[rows["respondent_id"] == "r3"].set_index("option")
    assert r3["target_status"].tolist() == [ANSWERED, ANSWERED]
    assert r3["answer"].tolist() == ["B", "B"]
    want = by_hand(NEW, {"t": "B"})["t"]
    assert float(r3.loc["A", "probability"]) == pytest.approx(want, abs=1e-6)
    assert list(rows.columns) == list(export.PREDICTION_COLUMNS)


def test_long_export_with_predictions(tiny: TinyStudy, db: Session) -> None:
    long = _csv("".join(export.csv_long(tiny.study, session=db, predictions=True)))
    assert list(long.columns) == [*export.LONG_COLUMNS, "kind", "probability"]
    assert "r4" not in set(long["respondent_id"])
    r1 = long[long["respondent_id"] == "r1"]
    assert r1[["item", "option", "kind"]].values.tolist() == [
        ["x", "B", "answered"],
        ["a", "A", "answered"],
        ["t", "B", "predicted"],
    ]
    t = r1[r1["kind"] == "predicted"].iloc[0]
    assert t["option_label"] == "no" and t["answered_at"] == ""
    assert float(t["probability"]) == pytest.approx(1 - 2.3 / 11, abs=1e-6)
    assert r1[r1["kind"] == "answered"]["probability"].tolist() == ["", ""]
    r2 = long[long["respondent_id"] == "r2"]
    assert r2[["item", "kind"]].values.tolist() == [
        ["x", "skipped"],
        ["a", "skipped"],
        ["x", "predicted"],
        ["a", "predicted"],
        ["t", "predicted"],
    ]
    plain = _csv("".join(export.csv_long(tiny.study, session=db)))
    assert list(plain.columns) == list(export.LONG_COLUMNS)
    answered = long[long["kind"] != "predicted"][list(export.LONG_COLUMNS)]
    assert plain.to_dict("records") == answered.reset_index(drop=True).to_dict("records")


def test_export_downloads_with_predictions(
    client: TestClient, tiny: TinyStudy, db: Session
) -> None:
    login(client, "alice@example.org")
    base = f"/admin/studies/{tiny.study.slug}/export"
    r = client.get(f"{base}/answers_wide.csv?predictions=1")
    assert r.status_code == 200
    assert 'filename="tiny-model-answers_wide-predictions.csv"' in r.headers["content-disposition"]
    assert "t__pred" in r.text.splitlines()[0]
    r = client.get(f"{base}/answers_long.csv?predictions=1")
    assert r.status_code == 200 and r.text.splitlines()[0].endswith("kind,probability")
    plain = client.get(f"{base}/answers_wide.csv")
    assert "__pred" not in plain.text
    # the imported respondents added: a name of its own (not the plain file's)
    for name, want in (
        ("answers_wide.csv", "tiny-model-answers_wide-with-imported.csv"),
        (
            "answers_wide.csv?predictions=1&",
            "tiny-model-answers_wide-with-imported-predictions.csv",
        ),
        ("answers.sav", "tiny-model-answers-with-imported.sav"),
    ):
        sep = "" if name.endswith("&") else "?"
        r = client.get(f"{base}/{name}{sep}imported=1")
        assert r.status_code == 200, r.text
        assert f'filename="{want}"' in r.headers["content-disposition"]
    long = client.get(f"{base}/answers_long.csv?imported=1")  # live answers only: refused
    assert long.status_code == 422 and "not &#39;answers_long.csv&#39;" in long.text
    bad = client.get(f"{base}/answers.sav?predictions=1")
    assert bad.status_code == 422 and "answers_long.csv and answers_wide.csv" in bad.text
    page = client.get(base)
    assert f"{base}/answers_wide.csv?predictions=1" in page.text


def test_predictions_need_a_model(client: TestClient, live_study_without_model: str) -> None:
    login(client, "alice@example.org")
    r = client.get(
        f"/admin/studies/{live_study_without_model}/export/answers_wide.csv?predictions=1"
    )
    assert r.status_code == 409 and "no fitted belief model" in r.text


@pytest.fixture
def live_study_without_model(db: Session, alice: Researcher) -> str:
    from app.services.designer import create_study

    return create_study("No model yet", owner=alice, session=db).slug


def test_an_order_dependent_model_gets_the_live_loops_replay(
    db: Session, alice: Researcher
) -> None:
    """The stacked mixture's weights depend on which observations are answers (and their
    order): the exports' predictions equal the live loop's replay (attributes first, then
    one update per answer in order), not the state of all observations at once."""
    import secrets

    import torch

    from app.services.designer import add_item, create_study
    from app.session import hash_token
    from app.tables import Answer, ElicitationSession, FittedModel, Respondent
    from elicitation.session import replay_state
    from tests.support.cape_cases import N_OPTIONS, mixture

    model = mixture()
    model.training_hash = "mixture"
    study = create_study("Mixture", owner=alice, session=db)
    roles = ("attribute", "question", "question", "target", "question")
    items = [
        add_item(
            study,
            session=db,
            key=f"q{i}",
            question=f"Question {i}?",
            options_text="\n".join(f"{chr(65 + k)}: option {k}" for k in range(n)),
            role=role,
        )
        for i, (n, role) in enumerate(zip(N_OPTIONS, roles, strict=True))
    ]
    db.add(
        FittedModel(
            study_id=study.id or 0,
            family=model.family,
            blob=model.to_bytes(),
            training_hash="mixture",
            is_active=True,
        )
    )
    resp = Respondent(study_id=study.id or 0, attributes={"q0": "B"})
    db.add(resp)
    db.flush()
    sess = ElicitationSession(
        study_id=study.id or 0,
        respondent_id=resp.id or 0,
        token_hash=hash_token(secrets.token_urlsafe(8)),
    )
    db.add(sess)
    db.flush()
    for i, letter in ((2, "A"), (1, "C"), (4, "B")):
        db.add(Answer(session_id=sess.id or 0, item_id=items[i].id or 0, option=letter))
    db.commit()

    want = model.predict(replay_state(model, {0: 1}, [(2, 0), (1, 2), (4, 1)]), [3])[0]
    [(row, found)] = list(export.predicted_rows(study, session=db))
    assert row.answer_order == ("q2", "q1", "q4")
    got = found.get("q3")
    assert got is not None and got.status == NOT_ASKED
    assert got.probabilities == pytest.approx(want[:4].tolist(), abs=1e-12)
    # all observations at once would be another state: this test can tell them apart
    at_once = model.predict_batch(model.initial_batch(torch.tensor([[1, 2, 0, -1, 1]])), [3])[0, 0]
    assert float((at_once - want).abs().max()) > 1e-4


def test_predictions_listing_says_a_first_model_is_being_fitted(
    db: Session, alice: Researcher
) -> None:
    """No model: 409 ``no_model``; with a queued first fit: 409 ``model_preparing``
    naming the job, as a session start says."""
    from app.services.belief import NoModelError
    from app.services.designer import add_item, create_study
    from app.services.learning import ModelPreparingError
    from app.services.results import predictions_page
    from app.tables import Job

    study = create_study("No model yet", owner=alice, session=db)
    add_item(study, session=db, key="q", question="Q?", options_text="A: a\nB: b", role="question")
    with pytest.raises(NoModelError):
        predictions_page(study, session=db, cursor=None, limit=None)
    fit = Job(kind="fit_model", study_id=study.id)
    db.add(fit)
    db.commit()
    with pytest.raises(ModelPreparingError, match=f"being fitted by job {fit.id}"):
        predictions_page(study, session=db, cursor=None, limit=None)
