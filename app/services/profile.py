"""Preference profile of a session (``GET /api/v1/sessions/{id}/profile``).

The profile is built from the state replayed from the stored attributes and answers
(never from a cache) with :func:`models.cape_profile.preference_profile`: items marked as
preference criteria (``Item.is_preference_criterion``, ordinal "how much do you care about
X?" items) ranked by expected level, the other items by the probability of their most
likely option, and a plain-text summary a product can put into a system prompt. Labels
are returned as stored; clients escape them on display.

:func:`session_predictions` is the predicted answer to every item of the session's
respondent (:mod:`app.services.predictions`, the exports' code path): the profile's
``predicted`` list and the API's predictions.
"""

from __future__ import annotations

from typing import Any

from sqlmodel import Session, select

from app.services import export
from app.services.predictions import (
    Evidence,
    RespondentPrediction,
    predict_respondents,
)
from app.session import (
    SessionNotFoundError,
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
    """The session's preference profile as a JSON-ready dict, under the model that
    predicts the respondent (:func:`session_predictions`): the session's own while it is in
    progress, the study's active model once it is finished (or for a preview).

    Returns:
        ``{"session_id", "answers", "model_family", "criteria": [...], "items": [...],
        "summary", "predicted": [...]}`` plus ``model_notice`` when the model is a fallback
        prior; each entry of ``criteria`` and ``items`` has ``item``, ``question``,
        ``option`` (label of the most likely option), ``option_index``, ``probability``,
        ``distribution``, ``expected_level`` (criteria and ordinal items), ``observed``,
        ``criterion``; ``predicted`` is every item of the study the respondent has not
        answered (targets, questions and attributes; :func:`session_predictions`), each
        ``{"item", "role", "question", "status", "predicted", "label", "probability",
        "distribution"}``.

    Raises:
        NoModelError: the study has no fitted belief model.
        SessionNotFoundError: the session was erased after the caller read it (404).
    """
    _n, predicted = session_predictions(study, sess, session=session)
    rt = load_runtime(study, session=session, fit_if_missing=False)
    rt = session_runtime(rt, study, predicted.model_id, session=session)
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
    observed = attribute_indices(rt, respondent.attributes)
    observed.update(
        (idx, option) for idx, option in answer_pairs(rt, answers) if option is not None
    )
    profile = preference_profile(rt.model, state, texts, observed=observed)
    out = {
        "session_id": sess.id,
        "answers": len(answers),
        "model_family": rt.model.family,
        **profile.to_dict(),
    }
    out["predicted"] = [p.to_dict() for p in predicted.unanswered]
    notice = (rt.model.metrics or {}).get("notice")
    if notice:  # e.g. a persona or uniform prior because the study has no history yet
        out["model_notice"] = str(notice)
    return out


def session_predictions(
    study: Study, sess: ElicitationSession, *, session: Session
) -> tuple[int, RespondentPrediction]:
    """``(answer rows, predictions)`` of the session's respondent: every item the model
    knows, from everything they answered in all their sessions, under the model of
    :func:`app.services.export.predicted_rows` (the exports' rows).

    A preview session (left out of the exports) is predicted from its own answers with
    the study's active model.

    Raises:
        NoModelError: the study has no fitted belief model (409).
        SessionNotFoundError: the session was erased after the caller read it (404).
    """
    if not sess.is_preview:
        found = next(export.predicted_rows(study, session=session, only=sess.respondent_id), None)
        if found is None:  # erased after the caller's authorization read it
            raise SessionNotFoundError(f"no session {sess.id}")
        row, result = found
        return row.n_answers, result
    respondent, answers = respondent_and_answers(session, sess)
    keys = {it.id: it.key for it in export.export_items(study, session=session)}
    given = [(keys[a.item_id], a.option) for a in answers if a.item_id in keys]
    ev = Evidence(
        respondent.id or 0,
        dict(respondent.attributes or {}),
        [(k, o) for k, o in given if o is not None],
        frozenset(k for k, o in given if o is None),
    )
    return len(answers), predict_respondents(study, [ev], session=session)[0]


__all__ = ["session_predictions", "session_profile"]
