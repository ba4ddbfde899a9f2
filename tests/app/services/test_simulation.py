"""The admin simulation ("how many questions do I need?") uses the study's chosen model."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.data import DATASETS_DIR, write_small_dataset


def _study(db: Any, folder: Any) -> Any:
    from app.services.designer import set_roles
    from app.services.importer import import_dataset
    from app.tables import Study

    result = import_dataset(write_small_dataset(DATASETS_DIR / "ces", folder, 200), session=db)
    study = db.get(Study, result.study_id)
    assert study is not None
    set_roles(study, dict.fromkeys(study.benchmark_runs[0]["eval_qids"], "target"), session=db)
    db.refresh(study)
    return study


def _simulate(db: Any, study: Any, belief_model: str) -> dict[str, Any]:
    from app.schemas import StudySettings
    from app.services.designer import update_settings
    from app.services.simulation import SimulationOptions, run_study_simulation

    values = StudySettings.model_validate(study.settings or {}).model_dump(mode="json")
    update_settings(study, {**values, "belief_model": belief_model}, session=db)
    options = SimulationOptions(budget=2, max_test_users=40, n_classes=(2,))
    return run_study_simulation(study, session=db, options=options)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_simulation_uses_the_study_belief_model(engine: Any, tmp_path: Any) -> None:
    """Latent classes, a CAPE model and the (uniform, no distributions stored) persona
    prior give three different simulations, each reporting the family it used; the
    uniform prior cannot learn from answers (flat curves), the others do."""
    from sqlmodel import Session

    with Session(engine) as db:
        study = _study(db, tmp_path / "ces200")
        lc = _simulate(db, study, "default")
        cape = _simulate(db, study, "cape_cooccurrence")
        flat = _simulate(db, study, "persona_mixture")
    assert (lc["belief_model"], lc["model_family"]) == ("default", "persona_mixture")
    assert (cape["belief_model"], cape["model_family"]) == (
        "cape_cooccurrence",
        "cape_cooccurrence",
    )
    assert flat["model_family"] == "persona_mixture"
    study_method = lc["study_method"]
    assert cape["methods"][study_method]["log_loss"] != lc["methods"][study_method]["log_loss"]
    for method in ("full", study_method):  # the baselines use the study's model too
        assert cape["methods"][method]["log_loss"][0] != lc["methods"][method]["log_loss"][0]
    curve = flat["methods"][study_method]["log_loss"]
    assert max(curve) - min(curve) < 1e-9 and flat["methods"]["full"]["log_loss"][0] == curve[0]
    assert lc["methods"]["full"]["log_loss"][0] < lc["methods"][study_method]["log_loss"][0]


def _live(db: Any, study: Any, answers: dict[str, str], *, preview: bool = False) -> None:
    from sqlmodel import select

    from app.tables import Answer, ElicitationSession, Item, Respondent

    items = {it.key: it for it in db.exec(select(Item).where(Item.study_id == study.id)).all()}
    resp = Respondent(study_id=study.id, attributes={"x": answers.pop("x")})
    db.add(resp)
    db.flush()
    sess = ElicitationSession(
        study_id=study.id, respondent_id=resp.id, token_hash=f"h{resp.id}", is_preview=preview
    )
    db.add(sess)
    db.flush()
    for key, option in answers.items():
        db.add(Answer(session_id=sess.id, item_id=items[key].id, option=option))
    db.commit()


@pytest.mark.parametrize("db_url", ["sqlite", "postgresql"], indirect=True)
def test_live_respondents_who_answered_every_question_are_simulated(
    engine: Any, alice: Any
) -> None:
    """No import: 12 live respondents answered both questions (and the target), 3 only
    what an adaptive loop asked, one is a preview. The 12 are replayable, the 3 fitted on
    only, the preview never used; with 10 replayable the page says why it cannot run."""
    from sqlmodel import Session

    from app.services.designer import add_item, create_study, study_items
    from app.services.simulation import (
        SimulationOptions,
        _split_of,
        run_study_simulation,
        simulation_respondents,
        unavailable_reason,
    )

    with Session(engine) as db:
        study = create_study("Pilot", owner=alice, session=db)
        for key, role in (
            ("x", "attribute"),
            ("a", "question"),
            ("b", "question"),
            ("t", "target"),
        ):
            add_item(
                study,
                session=db,
                key=key,
                question=f"{key}?",
                options_text="A: yes\nB: no",
                role=role,
            )
        for i in range(10):
            _live(
                db,
                study,
                {"x": "AB"[i % 2], "a": "AB"[i % 3 == 0], "b": "AB"[i % 2], "t": "AB"[i % 4 == 0]},
            )
        for _ in range(3):
            _live(db, study, {"x": "A", "a": "A", "t": "B"})
        _live(db, study, {"x": "A", "a": "A", "b": "A", "t": "A"}, preview=True)
        reason = unavailable_reason(study, session=db)
        assert reason is not None
        assert (
            "0 imported respondents and 10 live respondents who answered every question" in reason
        )
        for _ in range(2):
            _live(db, study, {"x": "B", "a": "B", "b": "B", "t": "B"})
        items = study_items(study, session=db)
        replayable, fit_only = simulation_respondents(study.id, items, session=db)
        assert len(replayable) == 12 and all(split == "live" for _, _, split in replayable)
        assert replayable[-1][1] == [1, 1, 1, 1]
        assert fit_only == [[0, 0, -1, 1]] * 3
        assert unavailable_reason(study, session=db) is None

        # a seed whose split puts a replayable respondent in test (ids differ by database)
        def fits(s: int) -> bool:
            where = [_split_of(r, s) for r, _, _ in replayable]
            return "test" in where and where.count("train") + len(fit_only) >= 10

        seed = next(s for s in range(200) if fits(s))
        result = run_study_simulation(
            study, session=db, options=SimulationOptions(budget=2, n_classes=(2,), seed=seed)
        )
    assert result["n_train"] + result["n_val"] + result["n_test"] == 15
    assert (
        result["n_test"] >= 1 and result["candidates"] == ["a", "b"] and result["targets"] == ["t"]
    )
