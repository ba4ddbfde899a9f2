"""What the survey learned about a respondent, in plain words, for the completion page.

Shown only when the study's ``show_learned`` setting is on
(:class:`app.schemas.StudySettings`). For each target item the respondent was not asked,
the most likely answer under the model after their answers and its probability; for
CAPE models also the preference profile's criteria (:func:`app.services.profile.session_profile`).

Example sentence: ``We think you would answer “Somewhat satisfied” to “How satisfied are
you with ...?” (72% sure).``
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlmodel import Session

from app import session as live
from app.services.profile import session_profile
from app.tables import ElicitationSession, Study

MAX_PREFERENCES = 5
"""Criteria of a CAPE preference profile shown (the highest expected levels)."""


@dataclass(frozen=True)
class Guess:
    """One predicted answer: the question, the most likely option's label and its
    probability in whole percent."""

    question: str
    answer: str
    percent: int


@dataclass(frozen=True)
class Learned:
    """What the completion page shows: ``targets`` (unasked target items) and
    ``preferences`` (a CAPE model's preference criteria; empty for other models)."""

    targets: list[Guess] = field(default_factory=list)
    preferences: list[Guess] = field(default_factory=list)


def learned_about(study: Study, sess: ElicitationSession, *, session: Session) -> Learned:
    """The predicted answers to the targets the respondent was not asked (and, for CAPE
    models, the unobserved preference criteria), from the replayed state."""
    rt = live.load_runtime(study, session=session, fit_if_missing=False)
    rt = live.session_runtime(rt, study, sess.model_id, session=session)
    answered = {a.item for a in live.session_answers(sess, session=session)}
    labels = {it.key: {str(o[0]): str(o[1]) for o in it.options} for it in rt.targets}
    targets = []
    for pred in live.predictions(study, sess, session=session).targets:
        if pred.item in answered or not pred.distribution:
            continue
        letter, p = max(pred.distribution.items(), key=lambda kv: kv[1])
        targets.append(Guess(pred.question, labels[pred.item][letter], round(100 * p)))
    preferences: list[Guess] = []
    if str(getattr(rt.model, "family", "")).startswith("cape"):
        profile = session_profile(study, sess, session=session)
        for entry in profile.get("criteria", []):
            if entry.get("observed"):
                continue
            preferences.append(
                Guess(
                    str(entry["question"]),
                    str(entry["option"]),
                    round(100 * float(entry["probability"])),
                )
            )
            if len(preferences) == MAX_PREFERENCES:
                break
    return Learned(targets, preferences)
