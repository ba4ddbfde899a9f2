"""GET /api/v1/sessions/{id}/profile: the preference profile of a session (issue 6).

A real database (SQLite file, and PostgreSQL when configured), the real CES data, the app
through TestClient. The profile is checked against the session's own predictions and
against the expected level computed from its distribution; unknown and foreign sessions
get 404.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlmodel import select

from app.tables import Item
from tests.support.data import DATASETS_DIR, write_small_dataset
from tests.support.live_study import LiveStudy, admin_study_page, app_client, ces_sample_study


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def live(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveStudy]:
    folder = tmp_path_factory.mktemp("profile")
    yield from ces_sample_study(request.param, folder, 120)


@pytest.fixture
def client(live: LiveStudy) -> Iterator[Any]:
    with app_client(live.url) as c:
        yield c


def bearer(credential: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {credential}"}


def start(client: Any, live: LiveStudy, answers: int) -> tuple[int, str, list[str]]:
    r = client.post(
        f"/api/v1/studies/{live.slug}/sessions",
        json={"attributes": {"gender4": "B"}},
        headers=bearer(live.owner_key),
    )
    assert r.status_code == 201, r.text
    body = r.json()
    sid, token, asked = body["session_id"], body["token"], []
    for n in range(answers):
        q = body["question"]
        asked.append(q["item"])
        r = client.post(
            f"/api/v1/sessions/{sid}/answers",
            json={"item": q["item"], "option": "A", "idempotency_key": f"p{n}"},
            headers=bearer(token),
        )
        assert r.status_code == 200, r.text
        body = r.json()
    return sid, token, asked


def test_profile_ranks_items_and_matches_the_predictions(client: Any, live: LiveStudy) -> None:
    sid, token, asked = start(client, live, 2)
    r = client.get(f"/api/v1/sessions/{sid}/profile", headers=bearer(token))
    assert r.status_code == 200, r.text
    prof = r.json()
    assert prof["session_id"] == sid and prof["answers"] == 2 and prof["criteria"] == []
    entries = prof["items"]
    probs = [e["probability"] for e in entries]
    assert probs == sorted(probs, reverse=True)
    by_key = {e["item"]: e for e in entries}
    for e in entries:
        assert sum(e["distribution"]) == pytest.approx(1.0)
        assert e["probability"] == pytest.approx(max(e["distribution"]))
    assert {k for k, e in by_key.items() if e["observed"]} == {*asked, "gender4"}
    # an answered item shows the answer itself ("A" to each question, "B" to gender4),
    # not the model's posterior predictive of it
    for key in asked:
        assert by_key[key]["option_index"] == 0 and by_key[key]["probability"] == 1.0
        assert by_key[key]["distribution"][0] == 1.0
        e = by_key[key]
        assert f"- {e['question']} {e['option']} (answered)" in prof["summary"]
    assert by_key["gender4"]["option_index"] == 1 and by_key["gender4"]["distribution"][1] == 1.0
    # the others: the same distributions as the session's predictions endpoint
    pred = client.get(f"/api/v1/sessions/{sid}/predictions", headers=bearer(token)).json()
    # the attributes the API did not send were never asked: unknown, not declined
    attrs = [p for p in pred["predicted"] if p["role"] == "attribute"]
    assert attrs and {p["status"] for p in attrs} == {"not asked"}
    assert "gender4" not in {p["item"] for p in attrs}
    for p in pred["items"] + pred["targets"]:
        assert p["status"] == "not asked"
        got = by_key[p["item"]]["distribution"]
        assert got == pytest.approx(list(p["distribution"].values()), abs=1e-12)
    top = entries[0]
    assert top["question"] in prof["summary"] and top["option"] in prof["summary"]
    # the study owner's API key sees the same profile
    again = client.get(f"/api/v1/sessions/{sid}/profile", headers=bearer(live.owner_key))
    assert again.status_code == 200 and again.json() == prof


def test_preference_criteria_are_ranked_by_expected_level(client: Any, live: LiveStudy) -> None:
    with live.session() as db:
        rows = db.exec(
            select(Item).where(Item.study_id == live.study_id, Item.key.in_(["educ", "faminc_new"]))  # type: ignore[attr-defined]
        ).all()
        for row in rows:
            row.is_preference_criterion = True
            db.add(row)
        db.commit()
    try:
        sid, token, _ = start(client, live, 1)
        prof = client.get(f"/api/v1/sessions/{sid}/profile", headers=bearer(token)).json()
        crit = prof["criteria"]
        assert {c["item"] for c in crit} == {"educ", "faminc_new"}
        for c in crit:
            want = sum((k + 1) * p for k, p in enumerate(c["distribution"]))
            assert c["expected_level"] == pytest.approx(want) and c["criterion"]
        levels = [c["expected_level"] for c in crit]
        assert levels == sorted(levels, reverse=True)
        assert "cares about most" in prof["summary"]
    finally:
        with live.session() as db:
            for row in db.exec(select(Item).where(Item.study_id == live.study_id)).all():
                row.is_preference_criterion = False
                db.add(row)
            db.commit()


def test_profile_of_unknown_or_foreign_session_is_404(client: Any, live: LiveStudy) -> None:
    sid, token, _ = start(client, live, 0)
    other_sid, other_token, _ = start(client, live, 0)
    url = f"/api/v1/sessions/{sid}/profile"
    assert client.get(url, headers=bearer(other_token)).status_code == 404
    assert client.get(url, headers=bearer(live.other_key)).status_code == 404
    missing = client.get("/api/v1/sessions/999999/profile", headers=bearer(live.owner_key))
    assert missing.status_code == 404
    assert client.get(url).status_code == 401
    assert client.get(url, headers=bearer(token)).status_code == 200


# ----- the fitted belief model: fallback prior without history, auto's comparison table ---


def _new_study(db: Any, folder: Any, n: int) -> Any:
    from app.services.importer import import_dataset
    from app.tables import Study

    data = write_small_dataset(DATASETS_DIR / "ces", folder, n)
    result = import_dataset(data, session=db)
    study = db.get(Study, result.study_id)
    assert study is not None
    return study


def _admin_page(url: str, slug: str) -> str:
    """The admin study page as an admin sees it (real login form, real session cookie)."""
    from sqlmodel import Session as DbSession

    from app.auth import create_account
    from app.db import make_engine

    engine = make_engine(url)
    with DbSession(engine) as db:
        create_account("c-admin@example.org", "correct horse battery", session=db, is_admin=True)
    engine.dispose()
    return admin_study_page(url, slug, "c-admin@example.org", "correct horse battery")


def test_study_without_history_falls_back_to_persona_prior_with_notice(
    engine: Any, migrated_db_url: str, tmp_path: Any
) -> None:
    """No historical respondents: the fit stores the study's persona prior (stored LLM
    distributions, persona weights as prior) with a notice; without distributions, a
    uniform prior with a notice. Exact predictions from the stored numbers."""
    import torch
    from sqlmodel import Session as DbSession

    from app.services.belief import fit_study_model
    from app.tables import PersonaDistribution, Respondent, StudyPersona
    from inference_server.prompts import PromptItem
    from models import load_model

    with DbSession(engine) as db:
        study = _new_study(db, tmp_path / "ces30", 30)
        for r in db.exec(select(Respondent).where(Respondent.study_id == study.id)).all():
            db.delete(r)
        db.commit()
        items = db.exec(
            select(Item).where(Item.study_id == study.id).order_by(Item.position, Item.id)  # type: ignore[arg-type]
        ).all()
        questions = [it for it in items if it.role == "question"]
        q1, q2, q3 = questions[:3]
        personas = [("young renter", 3.0), ("retired owner", 1.0)]
        for k, (text, weight) in enumerate(personas):
            db.add(
                StudyPersona(
                    study_id=study.id,
                    key=f"p{k}",
                    text=text,
                    text_hash=f"h{k}",
                    weight=weight,
                    source="file",
                )
            )
        table: dict[tuple[int, str], list[float]] = {}
        for k in range(2):
            for it in (q1, q2):
                n = len(it.options)
                raw = [float((k + 1) * (j + 1) if k == 0 else n - j) for j in range(n)]
                probs = [x / sum(raw) for x in raw]
                table[(k, it.key)] = probs
                db.add(
                    PersonaDistribution(
                        model_id="test-llm",
                        template_version="v1",
                        persona_hash=f"h{k}",
                        item_hash=PromptItem(
                            it.key, it.question, tuple(o[1] for o in it.options)
                        ).hash,
                        probs=probs,
                        valid_mass=1.0,
                    )
                )
        db.commit()
        row = fit_study_model(study, session=db)
        assert row.is_active and row.family == "persona_mixture"
        m = row.metrics
        assert m["prior"] == "persona" and m["distributions"] == 4 and m["n_personas"] == 2
        assert "no historical respondents" in m["notice"]
        assert "2 language-model personas" in m["notice"] and "test-llm" in m["notice"]
        model = load_model(row.blob)
        idx = {it.key: j for j, it in enumerate(items)}
        prior = torch.tensor([0.75, 0.25], dtype=torch.float64)
        state = model.initial_state({})
        for it in (q1, q2):
            n = len(it.options)
            expected = sum(prior[k] * torch.tensor(table[(k, it.key)]) for k in range(2))
            got = model.predict(state, [idx[it.key]])[0, :n]
            assert torch.allclose(got, expected.to(got.dtype), atol=1e-6)
        n3 = len(q3.options)  # no distribution stored: uniform for every persona
        got3 = model.predict(state, [idx[q3.key]])[0, :n3]
        assert torch.allclose(got3, torch.full((n3,), 1.0 / n3, dtype=got3.dtype), atol=1e-9)
        # Bayes after one answer: posterior over personas from the stored numbers
        state = model.update(state, idx[q1.key], 0)
        post = prior * torch.tensor([table[(k, q1.key)][0] for k in range(2)])
        post = post / post.sum()
        n2 = len(q2.options)
        expected = sum(post[k] * torch.tensor(table[(k, q2.key)]) for k in range(2))
        got = model.predict(state, [idx[q2.key]])[0, :n2]
        assert torch.allclose(got, expected.to(got.dtype), atol=1e-6)

        # no distributions either: a uniform prior, said so
        for r in db.exec(select(PersonaDistribution)).all():
            db.delete(r)
        db.commit()
        row2 = fit_study_model(study, session=db)
        assert row2.metrics["prior"] == "uniform" and "Uniform prior" in row2.metrics["notice"]
        assert row2.id != row.id and row2.is_active
        db.refresh(row)
        assert not row.is_active
        flat = load_model(row2.blob)
        got = flat.predict(flat.update(flat.initial_state({}), idx[q1.key], 1), [idx[q2.key]])
        assert torch.allclose(got[0, :n2], torch.full((n2,), 1.0 / n2, dtype=got.dtype))
        slug = study.slug
    page = _admin_page(migrated_db_url, slug)
    assert 'id="belief-model"' in page and "Uniform prior" in page


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # storage: the fallback test
def test_auto_belief_model_stores_and_shows_the_comparison_table(
    engine: Any, migrated_db_url: str, tmp_path: Any
) -> None:
    """``belief_model = auto``: the fit job's function stores the chosen model whose
    metrics hold the comparison table (every candidate and the stack, validation target
    log loss; skipped candidates with their reason), shown on the admin study page; the
    shipped model validates at least as well as every candidate."""
    from sqlmodel import Session as DbSession

    from app.schemas import StudySettings
    from app.services.belief import fit_study_model
    from app.services.designer import set_roles, update_settings
    from models import load_model

    with DbSession(engine) as db:  # enough validation respondents to compare the stack
        study = _new_study(db, tmp_path / "ces150", 150)
        set_roles(study, dict.fromkeys(study.benchmark_runs[0]["eval_qids"], "target"), session=db)
        values = StudySettings.model_validate(study.settings or {}).model_dump(mode="json")
        update_settings(study, {**values, "belief_model": "auto"}, session=db)
        row = fit_study_model(
            study,
            session=db,
            n_classes=(2,),
            n_restarts=1,
            fit_options={  # small fits: the test checks the wiring, not the models
                "cape_factor": {"dims": (1,), "steps": 30, "n_samples": 64},
                "cape_linear": {"dims": (1,)},
                "cape_cooccurrence": {"betas": (0.1,), "etas": (0.5,), "lams": (0.5,)},
            },
        )
        table = row.metrics["model_choice"]
        assert row.metrics["model_choice_respondents"] >= 10  # STACK_MIN_RESPONDENTS
        names = [r["name"] for r in table if "skipped" not in r]
        assert names == [
            "latent_classes",
            "cape_cooccurrence",
            "cape_linear",
            "cape_factor",
            "stacked_mixture",
        ]
        # no persona distributions stored: the persona candidates are skipped, with why
        skipped = {r["family"]: r["name"] for r in table if "skipped" in r}
        assert set(skipped) == {"persona_mixture", "mixed"}
        assert all("no persona dictionary" in shown for shown in skipped.values())
        (chosen,) = [r for r in table if r["chosen"]]
        singles = [
            r["mean_log_loss"]
            for r in table
            if "skipped" not in r and r["name"] != "stacked_mixture"
        ]
        # never worse than the best single candidate (the stack only when clearly better)
        assert chosen["mean_log_loss"] <= min(singles)
        assert chosen["name"] == row.metrics["auto_chosen"]
        model = load_model(row.blob)
        assert row.family == model.family
        if chosen["name"] == "stacked_mixture":
            assert model.family == "stacked_mixture" and set(model.names) <= set(names[:-1])
        slug = study.slug
        with pytest.raises(Exception, match="Belief model: Input should be 'default'"):
            update_settings(study, {**values, "belief_model": "nonsense"}, session=db)
    page = _admin_page(migrated_db_url, slug)
    assert 'id="model-choice"' in page and "stacked_mixture" in page and "cape_factor" in page
    assert "no persona dictionary" in page


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # storage: the fallback test
def test_auto_offers_the_study_persona_distributions_to_its_persona_candidates(
    engine: Any, tmp_path: Any
) -> None:
    """A study with history and stored persona distributions: ``auto`` scores the persona
    mixture and the persona + latent-class mixture (none skipped), and ships the best."""
    from sqlmodel import Session as DbSession

    from app.schemas import StudySettings
    from app.services.belief import fit_study_model
    from app.services.designer import set_roles, update_settings
    from app.tables import PersonaDistribution, StudyPersona
    from inference_server.prompts import PromptItem

    with DbSession(engine) as db:
        study = _new_study(db, tmp_path / "ces60", 60)
        set_roles(study, dict.fromkeys(study.benchmark_runs[0]["eval_qids"], "target"), session=db)
        values = StudySettings.model_validate(study.settings or {}).model_dump(mode="json")
        update_settings(study, {**values, "belief_model": "auto"}, session=db)
        items = db.exec(
            select(Item).where(Item.study_id == study.id).order_by(Item.position, Item.id)  # type: ignore[arg-type]
        ).all()
        for k in range(3):
            db.add(
                StudyPersona(
                    study_id=study.id,
                    key=f"p{k}",
                    text=f"persona {k}",
                    text_hash=f"h{k}",
                    weight=1.0,
                    source="file",
                )
            )
            for it in items:
                if it.role == "attribute":
                    continue
                n = len(it.options)
                raw = [float(1 + ((j + k) % n)) for j in range(n)]
                db.add(
                    PersonaDistribution(
                        model_id="test-llm",
                        template_version="v1",
                        persona_hash=f"h{k}",
                        item_hash=PromptItem(
                            it.key, it.question, tuple(o[1] for o in it.options)
                        ).hash,
                        probs=[x / sum(raw) for x in raw],
                        valid_mass=1.0,
                    )
                )
        db.commit()
        families = ("latent_classes", "persona_mixture", "mixed")
        row = fit_study_model(
            study,
            session=db,
            n_classes=(2,),
            n_restarts=1,
            fit_options={"auto": {"families": families}},
        )
        table = row.metrics["model_choice"]
        assert row.metrics["model_choice_skipped"] == {}
        from elicitation.model_choice import STACK_MIN_RESPONDENTS

        scored = row.metrics["model_choice_respondents"]
        stack = {"stacked_mixture"} if scored >= STACK_MIN_RESPONDENTS else set()
        assert {r["name"] for r in table} == {*families, *stack}
        assert bool(stack) != ("stack_skipped" in row.metrics["model_choice_rule"])
        (chosen,) = [r for r in table if r["chosen"]]
        assert chosen["mean_log_loss"] == min(r["mean_log_loss"] for r in table)
