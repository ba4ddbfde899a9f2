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
