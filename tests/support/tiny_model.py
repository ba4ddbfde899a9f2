"""A study with an enumerable belief model, for exact predictions by hand.

Two latent classes and three binary items (``x`` an attribute, ``a`` a question, ``t``
a target), options ``A: yes`` / ``B: no``. Two stored models: :data:`OLD` (the one the
sessions of respondents ``r1`` and ``r2`` recorded) and :data:`NEW` (active). Posterior
and predictive are a two-term sum:

    w_c ∝ prior_c · Π_observed P(item = option | c),   p(item = A) = Σ_c w_c P(A | c)
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass

import torch
from sqlmodel import Session, select

from app.services.designer import add_item, create_study
from app.session import hash_token
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
from models.base import ItemBank
from models.persona import PersonaMixture

KEYS = ("x", "a", "t")
OLD = {"prior": (0.4, 0.6), "A": {"x": (0.9, 0.2), "a": (0.8, 0.3), "t": (0.7, 0.1)}}
"""``prior`` of the 2 classes and ``P(option A | class)`` per item."""
NEW = {"prior": (0.5, 0.5), "A": {"x": (0.6, 0.4), "a": (0.5, 0.5), "t": (0.9, 0.2)}}


def persona_model(spec: dict, training_hash: str) -> PersonaMixture:
    mu = torch.tensor(
        [[[spec["A"][k][c], 1 - spec["A"][k][c]] for k in KEYS] for c in range(2)],
        dtype=torch.float64,
    )
    model = PersonaMixture(
        ItemBank(KEYS, (2, 2, 2)),
        mu,
        torch.tensor([math.log(p) for p in spec["prior"]], dtype=torch.float64),
    )
    model.training_hash = training_hash
    return model


def by_hand(spec: dict, observed: dict[str, str]) -> dict[str, float]:
    """``{item: p(item = A | observed)}`` under ``spec``, by enumeration of the 2 classes."""
    w = []
    for c in range(2):
        lik = spec["prior"][c]
        for key, letter in observed.items():
            pa = spec["A"][key][c]
            lik *= pa if letter == "A" else 1 - pa
        w.append(lik)
    z = sum(w)
    return {k: sum(w[c] / z * spec["A"][k][c] for c in range(2)) for k in KEYS}


@dataclass
class TinyStudy:
    study: Study
    old_id: int
    new_id: int
    respondents: dict[str, int]
    """``external id -> respondent id``: r1, r2 (old model), r3 (no decision: new model),
    r4 (a preview only), h1 (imported)."""
    tokens: dict[str, str]
    """``external id -> session token`` of the live ones."""
    sessions: dict[str, int]


def make_tiny_study(db: Session, owner: Researcher, name: str = "Tiny model") -> TinyStudy:
    """The study, its two models and five respondents (see :class:`TinyStudy`).

    * r1: attribute x = B, answered a = A (old model), earlier_starts 2;
    * r2: declined x, skipped a (old model);
    * r3: a session without any decision or answer (new model);
    * r4: a preview session that answered a = B (never exported);
    * h1: imported, x = A and a = B (new model).
    """
    study = create_study(name, owner=owner, session=db)
    for key, role in zip(KEYS, ("attribute", "question", "target"), strict=True):
        add_item(
            study,
            session=db,
            key=key,
            question=f"Question {key}?",
            options_text="A: yes\nB: no",
            role=role,
        )
    items = {it.key: it for it in db.exec(select(Item).where(Item.study_id == study.id)).all()}
    rows = []
    for spec, h, active in ((OLD, "tiny-old", False), (NEW, "tiny-new", True)):
        model = persona_model(spec, h)
        row = FittedModel(
            study_id=study.id or 0,
            family=model.family,
            blob=model.to_bytes(),
            training_hash=h,
            is_active=active,
        )
        db.add(row)
        db.flush()
        rows.append(row.id or 0)
    respondents: dict[str, int] = {}
    tokens: dict[str, str] = {}
    sessions: dict[str, int] = {}
    plan = [
        ("r1", {"x": "B"}, [("a", "A")], True, False, 2),
        ("r2", {}, [("a", None)], True, False, 0),
        ("r3", {}, [], False, False, 0),
        ("r4", {"x": "A"}, [("a", "B")], True, True, 0),
    ]
    for ext, attrs, answers, decided, preview, earlier in plan:
        resp = Respondent(
            study_id=study.id or 0, external_id=ext, attributes=attrs, earlier_starts=earlier
        )
        db.add(resp)
        db.flush()
        token = secrets.token_urlsafe(16)
        sess = ElicitationSession(
            study_id=study.id or 0,
            respondent_id=resp.id or 0,
            token_hash=hash_token(token),
            is_preview=preview,
        )
        db.add(sess)
        db.flush()
        if decided:
            for pos in range(len(answers) + 1):
                db.add(
                    SelectionDecision(
                        session_id=sess.id or 0,
                        position=pos,
                        item_id=items["a"].id if pos == 0 else None,
                        criterion="posterior_entropy",
                        scores={"scores": {}, "model_id": rows[0]},
                    )
                )
        for key, option in answers:
            db.add(Answer(session_id=sess.id or 0, item_id=items[key].id or 0, option=option))
        respondents[ext], tokens[ext], sessions[ext] = resp.id or 0, token, sess.id or 0
    hist = Respondent(
        study_id=study.id or 0,
        external_id="h1",
        source="import",
        attributes={"x": "A"},
        answers={"a": "B"},
    )
    db.add(hist)
    db.flush()
    respondents["h1"] = hist.id or 0
    study.status = "published"
    db.add(study)
    db.commit()
    db.refresh(study)
    return TinyStudy(study, rows[0], rows[1], respondents, tokens, sessions)
