"""Pydantic schemas of JSON columns and API payloads shared across the app."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.respondent_text import LANGUAGE_NAMES, LANGUAGES, Language

MAX_COUNT = 10_000
"""The most questions per session, rounds, or questions per respondent and round."""
MAX_PEOPLE = 100_000_000
"""The most respondents per group round."""
MAX_ANSWERS = 10**12
"""The largest overall answer budget of a group protocol."""
MAX_NATS = 1_000.0
"""The largest stopping threshold in nats (an item's entropy is at most log(options))."""
MAX_DROP_MINUTES = 30 * 24 * 60
"""The longest idle time before an unfinished session counts as dropped (30 days)."""
DEFAULT_REFIT_EVERY = 500
"""New completed live respondents between automatic refits (``refit_every``): in a replay
on CES, refitting every 100 to 1,000 respondents gave the same live target log loss
within noise (all better than never); 500 is the cheapest of the best (docs/models.md,
"The learning loop")."""
DEFAULT_CALIBRATION_ITEMS = 5
"""A new study's ``calibration_items`` (docs/models.md, "Calibration questions")."""
DEFAULT_CALIBRATION_MIN_ANSWERS = 300
"""A new study's ``calibration_min_answers`` (docs/models.md, "Calibration questions")."""


class Budgets(BaseModel):
    """How long one respondent's session may run.

    Numbers are bounded (``inf``, NaN and absurd values are refused with the field's name):
    see :data:`MAX_COUNT` and :data:`MAX_NATS`.

    Attributes:
        max_questions: stop after this many answered (or skipped) questions.
        min_questions: never stop (by a threshold) before this many.
        stop_eig_threshold: stop when the best expected information gain (nats) is below.
        stop_entropy_threshold: stop when the targets' predictive entropy (nats) is below.
        allow_skip: whether respondents may skip a question.
    """

    model_config = ConfigDict(extra="forbid")

    max_questions: int = Field(default=10, ge=1, le=MAX_COUNT)
    min_questions: int = Field(default=0, ge=0, le=MAX_COUNT)
    stop_eig_threshold: float | None = Field(default=None, ge=0, le=MAX_NATS, allow_inf_nan=False)
    stop_entropy_threshold: float | None = Field(
        default=None, ge=0, le=MAX_NATS, allow_inf_nan=False
    )
    allow_skip: bool = True

    @model_validator(mode="after")
    def _order(self) -> Budgets:
        if self.min_questions > self.max_questions:
            raise ValueError(
                f"min questions ({self.min_questions}) exceeds max questions ({self.max_questions})"
            )
        return self


class GroupSettings(BaseModel):
    """The group (panel) protocol: rounds of questions to a share of the respondents.

    Attributes:
        rounds: number of rounds.
        respondents_per_round: respondents asked per round (overrides the share when set).
        respondents_share: share of the panel asked per round, in (0, 1].
        total_answers: overall answer budget, or ``None`` for no cap.
        max_questions_per_respondent: round questions one respondent may be asked, over
            all rounds together.
        panel: whom the rounds ask: ``live`` (the study's live respondents), ``imported``
            (its imported respondents) or ``auto`` (live respondents when it has any,
            else imported ones). Read when round 1 is planned; later rounds keep round
            1's panel.
    """

    model_config = ConfigDict(extra="forbid")

    rounds: int = Field(default=4, ge=1, le=MAX_COUNT)
    respondents_per_round: int | None = Field(default=None, ge=1, le=MAX_PEOPLE)
    respondents_share: float = Field(default=0.1, gt=0, le=1, allow_inf_nan=False)
    total_answers: int | None = Field(default=None, ge=1, le=MAX_ANSWERS)
    max_questions_per_respondent: int = Field(default=1, ge=1, le=MAX_COUNT)
    panel: Literal["auto", "live", "imported"] = "auto"


class StudySettings(BaseModel):
    """``study.settings``: the selection criterion by name, budgets and group protocol.

    ``criterion``: a name of :mod:`elicitation.criteria`'s registry. The default
    ``eig_anchored`` (expected information gain about the targets minus 0.0005 nats per
    position skipped in the study's non-adaptive ``fixed`` order) is the benchmark's
    ``default`` (docs/benchmarks.md); it needs the fixed order, which is computed with the
    model fit and stored with the model (see :mod:`app.services.belief`). Studies keep the
    criterion they stored (``eig`` for studies created before it became the default).

    ``ask_attributes``: the browser flow asks the study's attribute items (demographics)
    before the first adaptive question (API clients pass known attributes instead).
    ``belief_model``: what the "fit model" job fits (``default`` latent classes, ``auto``,
    ``cape_cooccurrence``, ``cape_linear``, ``cape_factor``, ``persona_mixture``; see
    :data:`elicitation.model_choice.BELIEF_MODEL_CHOICES`).
    ``refit_every``: the learning loop (:mod:`app.services.learning`) queues a refit of the
    belief model after this many new completed live respondents since the last fit job
    (0: never automatically; "Refit now" on the study page always can). The new fit is
    promoted only when it beats the active model on the study's held-out respondents.
    ``calibration_items``: questions asked after the adaptive part, so that the model also
    learns about what the criterion never asks (the targets above all); they take the last
    places of ``budgets.max_questions`` (the budget the respondent sees; at most
    ``max_questions - 1`` of them, so one question at least is adaptive), and a session
    stopped earlier by a threshold asks none (:func:`app.session.decide.decide_next`).
    Each is drawn at random among the question and target items not asked yet, preferring
    those with fewer than ``calibration_min_answers`` observed answers in the active
    model's training data.
    ``calibration_min_answers``: calibration is asked only while some question or target
    item has fewer than this many observed answers in the data the active model was fitted
    on (0: always); a study with enough history asks none, and a new study stops once
    every item has been observed this often (docs/models.md, "Calibration questions").
    ``show_learned``: the completion page shows the respondent what the model learned
    about them (predicted answers to the targets with their confidence; for CAPE models
    the preference profile); off by default.
    ``drop_after_minutes``: an unfinished session whose last activity (start, attribute
    step or answer) is older than this many minutes counts as *dropped* on the dashboard,
    a younger one as *in progress* (1 to :data:`MAX_DROP_MINUTES`; default 60).
    ``language``: the language of the respondent pages (``en``, ``de``, ``fr``, ``es``; see
    :mod:`app.respondent_text`); the texts the researcher writes are shown as written.
    """

    model_config = ConfigDict(extra="forbid")

    criterion: str = "eig_anchored"
    ask_attributes: bool = True
    belief_model: Literal[
        "default", "auto", "cape_cooccurrence", "cape_linear", "cape_factor", "persona_mixture"
    ] = "default"
    budgets: Budgets = Field(default_factory=Budgets)
    group: GroupSettings = Field(default_factory=GroupSettings)
    show_learned: bool = False
    drop_after_minutes: int = Field(default=60, ge=1, le=MAX_DROP_MINUTES)
    refit_every: int = Field(default=DEFAULT_REFIT_EVERY, ge=0, le=MAX_PEOPLE)
    calibration_items: int = Field(default=DEFAULT_CALIBRATION_ITEMS, ge=0, le=MAX_COUNT)
    calibration_min_answers: int = Field(
        default=DEFAULT_CALIBRATION_MIN_ANSWERS, ge=0, le=MAX_PEOPLE
    )
    language: Language = "en"

    @field_validator("language", mode="before")
    @classmethod
    def _known_language(cls, value: object) -> object:
        if value not in LANGUAGES:
            known = ", ".join(f"{code} ({LANGUAGE_NAMES[code]})" for code in LANGUAGES)
            raise ValueError(f"unknown language {str(value)[:40]!r} (supported: {known})")
        return value
