"""Preference profile of a session (``GET /api/v1/sessions/{id}/profile``).

The profile is built from the state replayed from the stored attributes and answers
(never from a cache) with :func:`models.cape_profile.preference_profile`: items marked as
preference criteria (``Item.is_preference_criterion``, ordinal "how much do you care about
X?" items) ranked by expected level, the other items by the probability of their most
likely option, and a plain-text summary a product can put into a system prompt. Labels
are returned as stored; clients escape them on display.
"""

from __future__ import annotations

from typing import Any

from sqlmodel import Session, select

from app.session import (
    answer_pairs,
    attribute_indices,
    load_runtime,
    replay,
    respondent_and_answers,
    session_runtime,
)
from app.tables import ElicitationSession, Item, Study
from models.cape_profile import ItemText, preference_profile


def session_profile(study: Study, sess: ElicitationSession, *, session: Session) -> dict[str, Any]:
    """The session's preference profile as a JSON-ready dict.

    Returns:
        ``{"session_id", "answers", "model_family", "criteria": [...], "items": [...],
        "summary"}`` plus ``model_notice`` when the model is a fallback prior; each entry has ``item``, ``question``, ``option`` (label of the most
        likely option), ``option_index``, ``probability``, ``distribution``,
        ``expected_level`` (criteria and ordinal items), ``observed``, ``criterion``.

    Raises:
        NoModelError: the study has no fitted belief model.
        SessionNotFoundError: the session was erased after the caller read it (404).
    """
    rt = load_runtime(study, session=session, fit_if_missing=False)
    rt = session_runtime(rt, study, sess.model_id, session=session)  # the session's model
    respondent, answers = respondent_and_answers(session, sess)
    state = replay(rt, respondent, answers)
    criterion_ids = set(
        session.exec(
            select(Item.id).where(
                Item.study_id == study.id,
                Item.is_preference_criterion,  # type: ignore[arg-type]
            )
        ).all()
    )
    bank = rt.model.item_bank
    info_at = {idx: rt.by_id[item_id] for item_id, idx in rt.model_index.items()}
    texts: list[ItemText] = []
    for i, key in enumerate(bank.keys):
        it = info_at.get(i)
        if it is None:  # an item of the model that the study does not show
            texts.append(
                ItemText(key, key, tuple(f"option {k + 1}" for k in range(bank.n_options[i])))
            )
            continue
        crit = it.id in criterion_ids
        texts.append(
            ItemText(it.key, it.question, tuple(str(o[1]) for o in it.options), crit, crit)
        )
    observed = set(attribute_indices(rt, respondent.attributes))
    observed |= {idx for idx, option in answer_pairs(rt, answers) if option is not None}
    profile = preference_profile(rt.model, state, texts, observed=sorted(observed))
    out = {
        "session_id": sess.id,
        "answers": len(answers),
        "model_family": rt.model.family,
        **profile.to_dict(),
    }
    notice = (rt.model.metrics or {}).get("notice")
    if notice:  # e.g. a persona or uniform prior because the study has no history yet
        out["model_notice"] = str(notice)
    return out


__all__ = ["session_profile"]
