"""Persona sources, the persona prior's conditioning on attributes, and the uniform-prior
warning, on a tiny enumerable study (SQLite and PostgreSQL)."""

from __future__ import annotations

import math

import pytest
import torch
from sqlmodel import Session, select

from app.errors import InvalidInputError
from app.services import model_notes
from app.services import persona_input as pi
from app.services import personas as ps
from app.services.belief import (
    PERSONA_ATTRIBUTE_EPSILON,
    _study_items,
    fit_study_model,
    persona_prior_model,
)
from app.services.designer import add_item, create_study
from app.tables import PersonaDistribution, Researcher, Respondent, Study, StudyPersona
from inference_server.prompts import PromptItem
from models.base import load_model

EPS = PERSONA_ATTRIBUTE_EPSILON


@pytest.fixture
def tiny(db: Session, alice: Researcher) -> Study:
    """Attributes age (A young, B old) and region (A north, B south, C west); one
    question q (A yes, B no)."""
    study = create_study("Tiny personas", owner=alice, session=db)
    add_item(study, session=db, key="age", question="Your age?", options_text="A: Young\nB: Old",
             role="attribute", topic="Age", is_preference_criterion=False)  # fmt: skip
    add_item(study, session=db, key="region", question="Your region?",
             options_text="A: North\nB: South\nC: West", role="attribute", topic="Region",
             is_preference_criterion=False)  # fmt: skip
    add_item(study, session=db, key="q", question="Trust parliament?", options_text="A: Yes\nB: No",
             role="question", topic="", is_preference_criterion=False)  # fmt: skip
    return study


SHARES = {"age": {"A": "0.4", "B": "0.6"}, "region": {"A": 0.5, "B": 0.5, "C": 0}}


def _store_q(db: Session, study: Study, yes: dict[str, float], key: str = "q") -> None:
    """Store a distribution of item ``key`` (two options) for each persona text
    (``yes[text]`` = P(A))."""
    q = next(it for it in _study_items(study.id or 0, session=db) if it.key == key)
    h = PromptItem(q.key, q.question, tuple(o[1] for o in q.options)).hash
    for p in db.exec(select(StudyPersona).where(StudyPersona.study_id == study.id)).all():
        db.add(
            PersonaDistribution(
                model_id="m", template_version="v1", persona_hash=p.text_hash, item_hash=h,
                probs=[yes[p.text], 1 - yes[p.text]], valid_mass=1.0, flagged=False,
            )
        )  # fmt: skip
    db.commit()


def test_share_personas_are_the_weighted_product(db: Session, tiny: Study) -> None:
    attrs, _ = ps.study_items(tiny.id or 0, session=db)
    personas = ps.share_personas(attrs, SHARES)
    got = {p.text: (round(p.weight, 12), dict(p.attributes)) for p in personas}
    assert got == {
        "Age: Young; Region: North.": (0.2, {"age": 0, "region": 0}),
        "Age: Young; Region: South.": (0.2, {"age": 0, "region": 1}),
        "Age: Old; Region: North.": (0.3, {"age": 1, "region": 0}),
        "Age: Old; Region: South.": (0.3, {"age": 1, "region": 1}),
    }
    sampled = ps.share_personas(attrs, SHARES, sample=1000, seed=3)
    assert math.isclose(sum(p.weight for p in sampled), 1.0)
    assert {p.text for p in sampled} == set(got) and len(sampled) == 4
    with pytest.raises(InvalidInputError, match="2 attribute combinations, more than 1"):
        ps.share_personas(attrs, {"age": SHARES["age"]}, max_personas=1)


def test_a_sample_keeps_every_option_with_a_share(db: Session, tiny: Study) -> None:
    """Region West has a share of 2 %: a sample of 10 profiles has it in one profile, and
    each attribute's profiles count its options out as :func:`apportion` does (age 4/6,
    region 4/5/1); too small a sample for region's 3 options is refused, naming it."""
    attrs, _ = ps.study_items(tiny.id or 0, session=db)
    shares = {"age": {"A": 0.4, "B": 0.6}, "region": {"A": 0.49, "B": 0.49, "C": 0.02}}
    for seed in range(5):
        sampled = ps.share_personas(attrs, shares, sample=10, seed=seed)
        marginal: dict[tuple[str, int], float] = {}
        for p in sampled:
            for key, option in p.attributes.items():
                marginal[key, option] = marginal.get((key, option), 0) + p.weight
        got = {k: round(v * 10) for k, v in marginal.items()}
        assert got == {("age", 0): 4, ("age", 1): 6, ("region", 0): 4, ("region", 1): 5,
                       ("region", 2): 1}, seed  # fmt: skip
    with pytest.raises(InvalidInputError, match=r"sample: Region \(region\) has 3 options"):
        ps.share_personas(attrs, shares, sample=2)


@pytest.mark.parametrize(
    ("shares", "n", "counts"),
    [
        ([0.9, 0.08, 0.02], 10, [8, 1, 1]),
        ([0.49, 0.49, 0.02], 10, [4, 5, 1]),  # the third takes one from the first of the two 5s
        ([0.5, 0.5], 3, [2, 1]),
        ([1 / 3] * 3, 3, [1, 1, 1]),
        ([0.25, 0.75], 1000, [250, 750]),
    ],
)
def test_apportion_counts_out_exactly(shares: list[float], n: int, counts: list[int]) -> None:
    assert pi.apportion(shares, n, where="x") == counts
    assert sum(counts) == n


@pytest.mark.parametrize(
    ("shares", "message"),
    [
        ({"age": {"A": "0.4", "B": "0.5"}}, r"shares of Age \(age\) sum to 0.9, not 1"),
        ({"age": {"A": "0.4", "Z": "0.6"}}, r"shares of Age \(age\), option Z: not an option of age \(A, B\)"),
        ({"height": {"A": "1"}}, "'height' is not an attribute item of this study"),
        ({"age": {"A": "four", "B": "0.6"}}, r"shares of Age \(age\), option A: 'four' is not a number"),
        ({"age": {"A": "1.5", "B": "0.5"}}, "option A: '1.5' is not a share between 0 and 1"),
        ({"age": {"A": "0.5", "B": "-0.5"}}, "option B: '-0.5' is not a share between 0 and 1"),
        ({"age": {"A": "60%", "B": "50%"}}, r"shares of Age \(age\) sum to 110 %, not 100 % \(within 1\)"),
        ({"age": {"A": "30", "B": "50"}}, r"shares of Age \(age\) read as percentages sum to 80 %, not 100 % \(within 1\)"),
        ({"age": {"A": "150", "B": "50"}}, "option A: '150' is not a share between 0 and 1"),
        ({"age": {}}, r"shares of Age \(age\): no option has a share"),
        ({}, "give the shares of at least one attribute"),
        ({"q": {"A": "1"}}, "'q' is not an attribute item"),
        ({"age": {"A": "\uff10.\uff14", "B": "0.6"}}, "option A: '\uff10.\uff14' is not a number: write it with the ASCII digits 0-9"),
        ({"age": {"A": "\u0664\u0660%", "B": "60%"}}, "option A: '\u0664\u0660%' is not a number: write it with the ASCII digits 0-9"),
        ({"age": {"A": "0_4", "B": "0.6"}}, "option A: '0_4' is not a number$"),
        ({"age": {"A": "nan", "B": "1"}}, "option A: 'nan' is not a number$"),
    ],
)  # fmt: skip
def test_bad_shares_name_the_place_and_store_nothing(
    db: Session, tiny: Study, shares: dict, message: str
) -> None:
    with pytest.raises(InvalidInputError, match=message):
        ps.add_share_personas(tiny, shares, session=db)
    assert db.exec(select(StudyPersona)).all() == []


@pytest.mark.parametrize(
    ("given", "want"),
    [
        ({"A": "33.3", "B": "66.6"}, {"A": 33.3 / 99.9, "B": 66.6 / 99.9}),  # percent, rounded
        ({"A": "40%", "B": "0,6"}, {"A": 0.4, "B": 0.6}),
        ({"A": "0.333", "B": "0.666"}, {"A": 0.333 / 0.999, "B": 0.666 / 0.999}),
    ],
)
def test_shares_as_a_census_table_prints_them(
    db: Session, tiny: Study, given: dict, want: dict
) -> None:
    """Percentages, a decimal comma and rounding within 0.01 are read and rescaled to 1."""
    attrs, _ = ps.study_items(tiny.id or 0, session=db)
    got = pi.check_shares(attrs, {"age": given})["age"]
    assert got.keys() == want.keys()
    assert all(math.isclose(got[k], want[k], rel_tol=1e-12) for k in want)
    assert math.isclose(sum(got.values()), 1.0, rel_tol=1e-12)


def test_persona_keys_stay_unique_across_uploads_and_formats_do_not_mix(
    db: Session, tiny: Study
) -> None:
    ps.add_text_personas(tiny, "A nurse\nA farmer", session=db)
    ps.add_text_personas(tiny, "A teacher\nA nurse\nA pilot", session=db)
    keys = [r.key for r in db.exec(select(StudyPersona).order_by(StudyPersona.id)).all()]  # type: ignore[arg-type]
    assert keys == ["persona-1", "persona-2", "persona-1~2", "persona-3"]
    mixed = 'A retired farmer\n{"text": "A young developer", "weight": 2}\n'
    with pytest.raises(InvalidInputError, match="persona texts line 2: a JSON object, but"):
        ps.add_text_personas(tiny, mixed, session=db)
    assert ps.add_text_personas(tiny, "A {braced} word\n{not json", session=db) == 2
    with pytest.raises(InvalidInputError, match="p.json: expected a JSON list of personas"):
        ps.add_text_personas(tiny, '{"text": "A diver"}', filename="p.json", session=db)


def test_persona_texts_lines_and_jsonl_errors(db: Session, tiny: Study) -> None:
    assert ps.add_text_personas(tiny, "A nurse in Leeds\n\nA retired farmer\n", session=db) == 2
    raw = '{"text": "A student", "weight": 2}\n{"text": "x"\n'
    with pytest.raises(InvalidInputError, match="persona texts line 2: invalid JSON"):
        ps.add_text_personas(tiny, raw, session=db)
    with pytest.raises(InvalidInputError, match="p.jsonl line 1: weight must be a positive"):
        ps.add_text_personas(tiny, '{"text": "A", "weight": 0}', filename="p.jsonl", session=db)
    with pytest.raises(InvalidInputError, match="no persona texts"):
        ps.add_text_personas(tiny, "  \n \n", session=db)
    with pytest.raises(InvalidInputError, match="line 3: the same text as persona texts line 1"):
        ps.add_text_personas(tiny, "A\nB\nA", session=db)
    rows = db.exec(select(StudyPersona).order_by(StudyPersona.id)).all()  # type: ignore[arg-type]
    assert [(r.text, r.source, r.attributes) for r in rows] == [
        ("A nurse in Leeds", "texts", {}),
        ("A retired farmer", "texts", {}),
    ]


def test_answering_an_attribute_moves_the_posterior_to_matching_personas(
    db: Session, tiny: Study
) -> None:
    """Exact on 4 share personas + 1 free-text persona: ``p(θ | age = B) ∝ p(θ) μ[θ, age, B]``
    with ``μ = 1 − ε`` for the old personas, ``ε`` for the young, ``1/2`` (uniform) for
    the free-text one."""
    ps.add_share_personas(tiny, SHARES, session=db)
    ps.add_text_personas(tiny, "Someone", session=db)
    texts = [p.text for p in db.exec(select(StudyPersona).order_by(StudyPersona.id)).all()]  # type: ignore[arg-type]
    yes = dict(zip(texts, [0.9, 0.8, 0.3, 0.2, 0.5], strict=True))
    _store_q(db, tiny, yes)
    items = _study_items(tiny.id or 0, session=db)
    model = persona_prior_model(tiny, items, session=db)
    assert model.metrics["prior"] == "persona" and model.metrics["attribute_personas"] == 4
    keys = model.item_bank.keys
    age, region, q = keys.index("age"), keys.index("region"), keys.index("q")
    w = torch.tensor([0.2, 0.2, 0.3, 0.3, 1.0], dtype=torch.float64)
    w = w / w.sum()  # weights as stored; the free-text persona has weight 1
    assert torch.allclose(model.log_prior.exp(), w, atol=1e-12)
    assert model.mu[0, region].tolist() == [1 - EPS, EPS / 2, EPS / 2]
    assert model.mu[4, age, :2].tolist() == [0.5, 0.5]
    s = model.update(model.initial_state(), age, 1)  # answered "Old"
    lik = torch.tensor([EPS, EPS, 1 - EPS, 1 - EPS, 0.5], dtype=torch.float64)
    want = w * lik / (w * lik).sum()
    assert torch.allclose(s.log_post.exp(), want, atol=1e-12)
    p_yes = float((want * torch.tensor([0.9, 0.8, 0.3, 0.2, 0.5], dtype=torch.float64)).sum())
    assert float(model.predict(s, [q])[0, 0]) == pytest.approx(p_yes, abs=1e-12)
    s2 = model.update(s, region, 1)  # ... and "South": the old southerner leads
    lik2 = torch.tensor([EPS / 2, 1 - EPS, EPS / 2, 1 - EPS, 1 / 3], dtype=torch.float64)
    want2 = want * lik2 / (want * lik2).sum()
    assert torch.allclose(s2.log_post.exp(), want2, atol=1e-12)
    assert int(want2.argmax()) == 3


def test_respondent_personas_and_the_uniform_prior_warning(db: Session, tiny: Study) -> None:
    assert ps.uniform_prior_warning(tiny, session=db) == ps.uniform_prior_text(tiny)
    assert "(after 25, 50, 100, 200, 400, 800 completed respondents, then every 500," in (
        ps.uniform_prior_text(tiny)
    )
    tiny.settings = {**tiny.settings, "refit_every": 0}
    assert 'automatic refits are off: "Refit now"' in ps.uniform_prior_text(tiny)
    tiny.settings = {**tiny.settings, "refit_every": 500}
    with pytest.raises(InvalidInputError, match="no respondent has any of the attributes"):
        ps.add_respondent_personas(tiny, session=db)
    for ext, attrs in enumerate([{"age": "B", "region": "A"}] * 3 + [{"age": "A"}]):
        db.add(Respondent(study_id=tiny.id or 0, external_id=f"r{ext}", source="import",
                          attributes=attrs, answers={}))  # fmt: skip
    db.commit()
    assert ps.uniform_prior_warning(tiny, session=db) is None  # history: the fit uses it
    assert ps.add_respondent_personas(tiny, session=db) == 2
    rows = db.exec(select(StudyPersona).order_by(StudyPersona.id)).all()  # type: ignore[arg-type]
    assert [(r.text, r.weight, r.attributes, r.source) for r in rows] == [
        ("Age: Old; Region: North.", 3.0, {"age": "B", "region": "A"}, "respondents"),
        ("Age: Young.", 1.0, {"age": "A"}, "respondents"),
    ]


def test_a_fit_without_distributions_is_uniform_and_warned(db: Session, tiny: Study) -> None:
    ps.add_share_personas(tiny, SHARES, session=db)
    row = fit_study_model(tiny, session=db)
    assert row.metrics["prior"] == "uniform"
    assert ps.uniform_prior_warning(tiny, session=db) == ps.uniform_prior_text(tiny)
    texts = [p.text for p in db.exec(select(StudyPersona)).all()]
    _store_q(db, tiny, dict.fromkeys(texts, 0.7))
    row = fit_study_model(tiny, session=db)
    assert row.metrics["prior"] == "persona" and row.metrics["attribute_personas"] == 4
    assert ps.uniform_prior_warning(tiny, session=db) is None


def test_latent_classes_keep_the_persona_prior_on_items_nobody_answered(
    db: Session, tiny: Study
) -> None:
    """Respondents answered the attributes and q but never the target t: the latent classes
    fitted on them predict t as the persona prior's population does (Σ_p w_p P_p(t)), not
    uniformly, and q from the answers."""
    from app.services.belief import population_predictive
    from app.services.learning import load_row_model

    add_item(tiny, session=db, key="t", question="Trust courts?", options_text="A: Yes\nB: No",
             role="target", topic="", is_preference_criterion=False)  # fmt: skip
    ps.add_share_personas(tiny, SHARES, session=db)
    texts = sorted(p.text for p in db.exec(select(StudyPersona)).all())
    _store_q(db, tiny, dict(zip(texts, (0.7, 0.6, 0.5, 0.4), strict=True)))
    _store_q(db, tiny, dict(zip(texts, (0.9, 0.8, 0.1, 0.3), strict=True)), key="t")
    prior_row = fit_study_model(tiny, session=db)
    assert prior_row.metrics["prior"] == "persona"
    prior = load_row_model(prior_row)
    weights = {p.text: p.weight for p in db.exec(select(StudyPersona)).all()}
    t_yes = sum(weights[x] * y for x, y in zip(texts, (0.9, 0.8, 0.1, 0.3), strict=True))
    items = [it.key for it in _study_items(tiny.id or 0, session=db)]
    t = items.index("t")
    torch.testing.assert_close(
        population_predictive(prior)[t, :2],
        torch.tensor([t_yes, 1 - t_yes], dtype=torch.float64),
        atol=1e-3,
        rtol=0,
    )  # the prior's attribute items are near one-hot (ε), so within 1e-3
    for n in range(40):
        db.add(Respondent(study_id=tiny.id or 0, external_id=f"h{n}", source="import",
                          attributes={"age": "AB"[n % 2], "region": "AB"[n % 3 == 0]},
                          answers={"q": "A" if n % 4 else "B"}))  # fmt: skip
    db.commit()
    row = fit_study_model(tiny, session=db, n_classes=(2,), n_restarts=1, force=True)
    assert row.family == "persona_mixture" and row.metrics["dirichlet_base"] == "given"
    fitted = load_row_model(row)
    torch.testing.assert_close(
        fitted.mu[:, t, :2], population_predictive(prior)[t, :2].expand(fitted.mu.shape[0], 2)
    )
    q_yes = float(population_predictive(fitted)[items.index("q"), 0])
    assert abs(q_yes - 30 / 40) < 0.05  # q from the 40 answers (30 A), barely smoothed


def test_generation_progress_message() -> None:
    now = [100.0]
    seen: list[tuple[float, str]] = []
    on = ps.generation_progress(400, lambda f, m: seen.append((f, m)), clock=lambda: now[0])
    on(0, 380)
    now[0] += 30.0
    on(100, 380)
    assert seen[0] == (20 / 400, "20 of 400 pairs scored (20 stored before)")
    assert seen[1] == (
        120 / 400,
        "120 of 400 pairs scored (20 stored before), 3.33 pairs/s, about 1 min 24 s left",
    )


def test_a_large_persona_prior_is_compressed_for_the_live_step(
    db: Session, tiny: Study, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above the threshold (here 3 personas instead of 2,000) the fitted persona prior is
    the compressed one: 2 prototypes, priors summing to 1, metrics saying so."""
    from functools import partial

    from app.services import belief
    from models.persona_fit import compress_for_live

    monkeypatch.setattr(
        belief, "compress_for_live", partial(compress_for_live, above=3, n_prototypes=2)
    )
    ps.add_share_personas(tiny, SHARES, session=db)
    texts = [p.text for p in db.exec(select(StudyPersona).order_by(StudyPersona.id)).all()]  # type: ignore[arg-type]
    _store_q(db, tiny, dict(zip(texts, [0.9, 0.8, 0.3, 0.2], strict=True)))
    model = persona_prior_model(tiny, _study_items(tiny.id or 0, session=db), session=db)
    assert model.n_personas == 2 and model.metrics["compressed_from"] == 4
    assert model.metrics["n_personas"] == 4
    assert "compressed to 2 prototypes for the live step" in model.metrics["notice"]
    assert float(model.log_prior.exp().sum()) == pytest.approx(1.0)
    assert model.metrics["compression_seconds"] >= 0
    again = persona_prior_model(tiny, _study_items(tiny.id or 0, session=db), session=db)
    assert again.training_hash == model.training_hash  # the timing is not hashed
    row = fit_study_model(tiny, session=db)
    assert row.metrics["compressed_from"] == 4


def test_the_live_runtime_conditions_on_a_respondents_attributes(db: Session, tiny: Study) -> None:
    """The live loop replays a respondent's stored attributes through the fitted persona
    prior: an old southerner's predicted P(q = yes) is the exact posterior mix."""
    from app.session import load_runtime
    from app.session.state import replay

    ps.add_share_personas(tiny, SHARES, session=db)
    texts = [p.text for p in db.exec(select(StudyPersona).order_by(StudyPersona.id)).all()]  # type: ignore[arg-type]
    yes = torch.tensor([0.9, 0.8, 0.3, 0.2], dtype=torch.float64)
    _store_q(db, tiny, dict(zip(texts, yes.tolist(), strict=True)))
    fit_study_model(tiny, session=db)
    rt = load_runtime(tiny, session=db)
    person = Respondent(study_id=tiny.id or 0, external_id="live-1", source="live",
                        attributes={"age": "B", "region": "B"}, answers={})  # fmt: skip
    state = replay(rt, person, [])
    w = torch.tensor([0.2, 0.2, 0.3, 0.3], dtype=torch.float64)
    lik = torch.tensor([EPS * (EPS / 2), EPS * (1 - EPS), (1 - EPS) * (EPS / 2), (1 - EPS) ** 2],
                       dtype=torch.float64)  # fmt: skip
    post = w * lik / (w * lik).sum()
    q = rt.model.item_bank.keys.index("q")
    assert float(rt.model.predict(state, [q])[0, 0]) == pytest.approx(
        float((post * yes).sum()), abs=1e-12
    )


def test_a_refit_on_few_respondents_keeps_the_census_weights(db: Session, tiny: Study) -> None:
    """The persona prior refitted by EM on 3 respondents who all answer like the young
    northerner: the census weights count as PERSONA_PRIOR_STRENGTH respondents, so each
    weight moves by at most 3 / (3 + s) and none drops to 0."""
    from app.services.belief import PERSONA_PRIOR_STRENGTH

    ps.add_share_personas(tiny, SHARES, session=db)
    texts = [p.text for p in db.exec(select(StudyPersona).order_by(StudyPersona.id)).all()]  # type: ignore[arg-type]
    _store_q(db, tiny, dict(zip(texts, [0.99, 0.6, 0.3, 0.01], strict=True)))
    items = _study_items(tiny.id or 0, session=db)
    census = persona_prior_model(tiny, items, session=db).log_prior.exp()
    keys = [it.key for it in items]
    history = torch.full((3, len(keys)), -1, dtype=torch.long)
    history[:, keys.index("q")] = 0  # "yes", three times
    model = persona_prior_model(tiny, items, session=db, history=history)
    s = PERSONA_PRIOR_STRENGTH
    refit = model.log_prior.exp()
    assert bool(((refit - census).abs() <= 3 / (3 + s) + 1e-9).all())
    assert bool((refit >= census * s / (3 + s) - 1e-9).all())
    assert float(refit[0]) > float(census[0])  # the data still move it
    assert "the personas' weights counting as 10" in model.metrics["notice"]


def test_respondents_with_only_attributes_keep_the_persona_prior(db: Session, tiny: Study) -> None:
    """Imported respondents who gave their age and region but answered no question: the
    fit keeps the persona prior (so a respondent's attributes still point to personas)
    instead of latent classes fitted on no answers, and says why; once one respondent
    answers q, the fit is latent classes."""
    ps.add_share_personas(tiny, SHARES, session=db)
    texts = [p.text for p in db.exec(select(StudyPersona).order_by(StudyPersona.id)).all()]  # type: ignore[arg-type]
    _store_q(db, tiny, dict(zip(texts, [0.9, 0.8, 0.3, 0.2], strict=True)))
    for i, attrs in enumerate([{"age": "A", "region": "A"}, {"age": "B", "region": "B"}] * 3):
        db.add(Respondent(study_id=tiny.id or 0, external_id=f"r{i}", source="import",
                          attributes=attrs, answers={}))  # fmt: skip
    db.commit()
    assert "gave only their attributes" in model_notes.persona_use(tiny, session=db)
    row = fit_study_model(tiny, session=db, n_classes=(2,), n_restarts=1)
    assert row.metrics["prior"] == "persona"
    assert "respondents, none with an answer to a question or target" in row.metrics["notice"]
    model = load_model(row.blob)
    keys = model.item_bank.keys
    young = model.update(model.initial_state(), keys.index("age"), 0)
    old = model.update(model.initial_state(), keys.index("age"), 1)
    q = keys.index("q")
    assert float(model.predict(young, [q])[0, 0]) > float(model.predict(old, [q])[0, 0]) + 0.3
    db.add(Respondent(study_id=tiny.id or 0, external_id="r9", source="import",
                      attributes={"age": "A"}, answers={"q": "A"}))  # fmt: skip
    db.commit()
    refit = fit_study_model(tiny, session=db, n_classes=(2,), n_restarts=1, force=True)
    assert refit.metrics.get("prior") is None and refit.metrics.get("model") == "latent_class"
