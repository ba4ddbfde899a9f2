"""Predicted answers of respondents: for every item, the probability of each option under
the respondent's posterior (one code path for the exports, the API and the admin profile).

A respondent's *evidence* (:class:`Evidence`) is what they told us: their attributes
(``{item key: option letter}``) and the answers of all their (non-preview) sessions in the
order given (a later answer to the same item replacing an earlier one), skips and declined
attributes left out. Their posterior is the belief model's state after the live loop's own
replay (:func:`elicitation.session.replay_state`): the initial state given the attributes,
then one update per answer in order, so the numbers equal the live session's even for a
model whose state depends on the order (the stacked mixture's weights). Each item's
predictive distribution is ``p(Y_i = k | evidence)``; the most likely option is the
prediction (the first one on a tie).

Which model: while the respondent has a session in progress (status ``active``), the one
that session uses, i.e. the ``model_id`` recorded in its newest selection decision
(:func:`session_models`), so the predictions match the posterior that picks their next
question; otherwise the study's active model (a finished, abandoned or imported
respondent, a session stopped before its first decision, a model row that no longer
exists), so a respondent who answered under an early model, even the uniform cold-start
prior, is predicted by the best model promoted since. Imported respondents (history) keep
what they answered; their missing items are predicted by the active model given their
answers (in-sample when the model was fitted on them).

Items the model does not know (another key, or another number of options) get no
prediction. Batches are computed together (:func:`predict_respondents`): per model and
batch one ``initial_batch``, one ``update_batch`` per answer position and one
``predict_batch``, so an export of 5,000 respondents × 40 items is a few hundred small
matrix products.

Example (2 classes with prior ``(0.5, 0.5)``, items ``a``, ``b`` binary with
``P(A | class 1) = 0.8``, ``P(A | class 2) = 0.2``; a respondent answered ``a = A``)::

    posterior  = (0.8, 0.2)
    p(b = A)   = 0.8 * 0.8 + 0.2 * 0.2 = 0.68   -> predicted "A" with probability 0.68
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from sqlalchemy import func
from sqlmodel import Session, col, select

from app.services.belief import ActiveModelRef, NoModelError, active_model_ref, load_cached_model
from app.session.runtime import ItemInfo, model_item_index
from app.tables import (
    ElicitationSession,
    FittedModel,
    Item,
    SelectionDecision,
    SessionStatus,
    Study,
)

TOP_PERSONAS = 5
"""Latent classes (personas) listed per respondent: the largest posterior weights."""

NOT_ASKED, ANSWERED, SKIPPED = "not asked", "answered", "skipped"
"""An item's status for a respondent (:attr:`ItemPrediction.status`)."""


@dataclass(frozen=True)
class Evidence:
    """What one respondent told us.

    Attributes:
        respondent_pk: the respondent's database id.
        attributes: ``{item key: option letter}`` known before any question.
        answers: ``(item key, option letter)`` in the order given (no skips; one per key).
        skipped: item keys they were asked and skipped (or attributes they declined).
        model_id: the fitted model their sessions used (``None``: the active model).
    """

    respondent_pk: int
    attributes: Mapping[str, str]
    answers: Sequence[tuple[str, str]] = ()
    skipped: frozenset[str] = frozenset()
    model_id: int | None = None

    @property
    def observed(self) -> dict[str, str]:
        """``{item key: option letter}`` of the attributes and answers."""
        return {**self.attributes, **dict(self.answers)}


@dataclass(frozen=True)
class ItemPrediction:
    """One item's predictive distribution for one respondent.

    Attributes:
        options: ``(letter, label)`` pairs in the item's order.
        probabilities: ``p(Y = options[k])``, same order, summing to 1.
        status: :data:`ANSWERED` (in the evidence), :data:`SKIPPED` or :data:`NOT_ASKED`.
    """

    key: str
    role: str
    question: str
    options: tuple[tuple[str, str], ...]
    probabilities: tuple[float, ...]
    status: str
    best: int = -1
    """The most probable option's index when already known (else computed)."""

    @property
    def predicted(self) -> int:
        """Index of the most probable option (the first one on a tie)."""
        if self.best >= 0:
            return self.best
        return max(range(len(self.options)), key=lambda k: self.probabilities[k])

    @property
    def letter(self) -> str:
        return self.options[self.predicted][0]

    @property
    def label(self) -> str:
        return self.options[self.predicted][1]

    @property
    def probability(self) -> float:
        return self.probabilities[self.predicted]

    @property
    def distribution(self) -> dict[str, float]:
        """``{letter: probability}``."""
        return {o[0]: p for o, p in zip(self.options, self.probabilities, strict=True)}

    def to_dict(self) -> dict[str, Any]:
        """The API's shape: ``item``, ``role``, ``question``, ``status``, ``predicted``
        (letter), ``label``, ``probability`` and ``distribution``."""
        return {
            "item": self.key,
            "role": self.role,
            "question": self.question,
            "status": self.status,
            "predicted": self.letter,
            "label": self.label,
            "probability": self.probability,
            "distribution": self.distribution,
        }


@dataclass(frozen=True)
class RespondentPrediction:
    """A respondent's predictions for every item the model knows, in study order.

    Attributes:
        model_id: the fitted model used; ``model_from_session``: whether it is the one their
            sessions recorded (else the active model).
        n_observed: items in the evidence the model knows (what the posterior conditions on).
        items: every study item the model knows (answered ones too: their posterior
            predictive), see :attr:`unanswered`.
        personas: ``[{"persona", "label", "weight"}]``, the top posterior classes (mixture
            models; empty for others).
    """

    respondent_pk: int
    model_id: int
    model_from_session: bool
    n_observed: int
    items: tuple[ItemPrediction, ...]
    personas: tuple[dict[str, Any], ...] = field(default=())

    @property
    def unanswered(self) -> list[ItemPrediction]:
        """The items without an answer (never asked, skipped or declined), study order."""
        return [p for p in self.items if p.status != ANSWERED]

    def get(self, key: str) -> ItemPrediction | None:
        return next((p for p in self.items if p.key == key), None)


@dataclass
class _Loaded:
    model_id: int
    model: Any
    items: list[ItemInfo]  # the study items the model knows, study order
    index: dict[str, int]  # key -> bank index
    letters: dict[str, list[str]]
    options: list[tuple[tuple[str, str], ...]]  # per item of ``items``

    def lookup(self, key: str, letter: str) -> tuple[int, int] | None:
        """``(bank index, option index)`` of an observation, ``None`` if unusable."""
        idx = self.index.get(key)
        letters = self.letters.get(key)
        if idx is None or letters is None or letter not in letters:
            return None
        return idx, letters.index(letter)


class ModelSet:
    """The study's fitted models by id, loaded once (per process cache of
    :mod:`app.services.belief`) with their item mapping; the active one first.

    Raises:
        NoModelError: the study has no active fitted model (409).
    """

    def __init__(self, study: Study, *, session: Session) -> None:
        self.study = study
        self.session = session
        ref = active_model_ref(study.id or 0, session=session)
        if ref is None:
            raise NoModelError(f"study {study.slug!r} has no fitted belief model")
        self.items = [
            ItemInfo(it.id or 0, it.key, it.question, list(it.options), it.role, it.topic)
            for it in session.exec(
                select(Item).where(Item.study_id == study.id).order_by(Item.position, Item.id)  # type: ignore[arg-type]
            ).all()
        ]
        self._loaded: dict[int, _Loaded | None] = {}
        self.active = self._load(ref)

    def _load(self, ref: ActiveModelRef) -> _Loaded:
        model = load_cached_model(ref, session=self.session)
        index_by_id = model_item_index(model.item_bank, self.items)
        known = [it for it in self.items if it.id in index_by_id]
        loaded = _Loaded(
            ref.id,
            model,
            known,
            {it.key: index_by_id[it.id] for it in known},
            {it.key: [str(o[0]) for o in it.options] for it in known},
            [tuple((str(o[0]), str(o[1])) for o in it.options) for it in known],
        )
        self._loaded[ref.id] = loaded
        return loaded

    def get(self, model_id: int | None) -> tuple[_Loaded, bool]:
        """``(the model, whether it is model_id)``: the active one when ``model_id`` is
        ``None`` or not a stored model of this study."""
        if model_id is None:
            return self.active, False
        if model_id not in self._loaded:
            row = self.session.exec(
                select(FittedModel.id, FittedModel.training_hash).where(
                    FittedModel.id == model_id, FittedModel.study_id == self.study.id
                )
            ).first()
            if row is None:
                self._loaded[model_id] = None
            else:
                self._load(ActiveModelRef(int(row[0] or 0), str(row[1])))
        hit = self._loaded[model_id]
        return (hit, True) if hit is not None else (self.active, False)


def session_models(respondent_pks: Iterable[int], *, session: Session) -> dict[int, int]:
    """``{respondent id: model id}``: the ``model_id`` recorded in the newest selection
    decision of each respondent's non-preview sessions still in progress (status
    ``active``); respondents without one are left out, and are predicted by the study's
    active model. One query for the whole batch (the last decision per session)."""
    pks = list(respondent_pks)
    if not pks:
        return {}
    last = (
        select(
            SelectionDecision.session_id.label("sid"),  # type: ignore[attr-defined]
            func.max(SelectionDecision.position).label("pos"),
        )
        .join(ElicitationSession, col(ElicitationSession.id) == col(SelectionDecision.session_id))
        .where(
            col(ElicitationSession.respondent_id).in_(pks),
            col(ElicitationSession.is_preview).is_(False),
            col(ElicitationSession.status) == SessionStatus.active.value,
        )
        .group_by(col(SelectionDecision.session_id))
        .subquery()
    )
    rows = session.exec(
        select(ElicitationSession.respondent_id, SelectionDecision.id, SelectionDecision.scores)
        .join(
            last,
            (last.c.sid == SelectionDecision.session_id)
            & (last.c.pos == SelectionDecision.position),
        )  # type: ignore[arg-type]
        .join(ElicitationSession, col(ElicitationSession.id) == col(SelectionDecision.session_id))
    ).all()
    out: dict[int, tuple[int, int]] = {}
    for rid, did, scores in rows:
        model_id = (scores or {}).get("model_id")
        if isinstance(model_id, int) and (rid not in out or did > out[rid][0]):
            out[rid] = (did or 0, model_id)
    return {rid: m for rid, (_, m) in out.items()}


def predict_respondents(
    study: Study,
    evidence: Sequence[Evidence],
    *,
    session: Session,
    models: ModelSet | None = None,
) -> list[RespondentPrediction]:
    """Every respondent's predictions (same order as ``evidence``), batched per model.

    For the respondents of one model: the initial states given the attributes
    (``model.initial_batch(attributes [B, I])``, option index or ``-1``), then for answer
    position ``t = 0, 1, ...`` one ``model.update_batch`` with each respondent's ``t``-th
    answer (``-1``, no change, for those with fewer), which is the live loop's replay in
    batch; then ``model.predict_batch(states, items) [B, n, O]`` over every study item the
    model knows. A key the model does not know, a letter that is not one of the item's
    options, or a second observation of one item is ignored.

    Raises:
        NoModelError: the study has no active fitted model (409).
    """
    models = models if models is not None else ModelSet(study, session=session)
    groups: dict[int, list[int]] = {}
    chosen: list[tuple[_Loaded, bool]] = []
    for j, ev in enumerate(evidence):
        loaded, from_session = models.get(ev.model_id)
        chosen.append((loaded, from_session))
        groups.setdefault(loaded.model_id, []).append(j)
    out: list[RespondentPrediction | None] = [None] * len(evidence)
    for rows in groups.values():
        loaded = chosen[rows[0]][0]
        model = loaded.model
        grid = [[-1] * model.item_bank.n_items for _ in rows]
        steps: list[list[tuple[int, int]]] = []
        counts = []
        for r, j in enumerate(rows):
            seen: set[int] = set()
            mine: list[tuple[int, int]] = []
            for key, letter in evidence[j].attributes.items():
                hit = loaded.lookup(key, letter)
                if hit is not None and hit[0] not in seen:
                    grid[r][hit[0]] = hit[1]
                    seen.add(hit[0])
            n_attr = len(seen)
            for key, letter in evidence[j].answers:
                hit = loaded.lookup(key, letter)
                if hit is not None and hit[0] not in seen:
                    mine.append(hit)
                    seen.add(hit[0])
            steps.append(mine)
            counts.append(n_attr + len(mine))
        if loaded.items:
            state = model.initial_batch(torch.tensor(grid, dtype=torch.long))
            for t in range(max((len(m) for m in steps), default=0)):
                at = [m[t] if t < len(m) else (0, -1) for m in steps]
                state = model.update_batch(
                    state,
                    torch.tensor([a[0] for a in at], dtype=torch.long),
                    torch.tensor([a[1] for a in at], dtype=torch.long),
                )
            probs = model.predict_batch(state, [loaded.index[it.key] for it in loaded.items])
            top = _top_personas(model, state, len(rows))
        else:
            probs = torch.zeros(len(rows), 0, model.item_bank.max_options)
            top = [[] for _ in rows]
        table, best = probs.tolist(), probs.argmax(dim=-1).tolist()  # argmax: first on a tie
        for r, j in enumerate(rows):
            ev = evidence[j]
            observed = ev.observed
            items = tuple(
                ItemPrediction(
                    key=it.key,
                    role=it.role,
                    question=it.question,
                    options=opts,
                    probabilities=tuple(table[r][i][: len(opts)]),
                    status=ANSWERED
                    if it.key in observed
                    else SKIPPED
                    if it.key in ev.skipped
                    else NOT_ASKED,
                    best=best[r][i],
                )
                for i, (it, opts) in enumerate(zip(loaded.items, loaded.options, strict=True))
            )
            out[j] = RespondentPrediction(
                respondent_pk=ev.respondent_pk,
                model_id=loaded.model_id,
                model_from_session=chosen[j][1],
                n_observed=counts[r],
                items=items,
                personas=tuple(top[r]),
            )
    return [p for p in out if p is not None]


def _top_personas(model: Any, state: Any, n: int) -> list[list[dict[str, Any]]]:
    """Per batch row (``n``), the :data:`TOP_PERSONAS` largest posterior class weights
    (mixture models with ``latent_posterior_batch``; empty lists otherwise)."""
    latent = getattr(model, "latent_posterior_batch", None)
    if not callable(latent):
        return [[] for _ in range(n)]
    w = latent(state)
    k = min(TOP_PERSONAS, int(w.shape[1]))
    top = torch.topk(w, k, dim=1)
    labels = getattr(model, "labels", None)
    return [
        [
            {
                "persona": int(i),
                "label": labels[i] if labels else f"class {i + 1}",
                "weight": float(v),
            }
            for v, i in zip(vals, idxs, strict=True)
        ]
        for vals, idxs in zip(top.values.tolist(), top.indices.tolist(), strict=True)
    ]


__all__ = [
    "ANSWERED",
    "NOT_ASKED",
    "SKIPPED",
    "Evidence",
    "ItemPrediction",
    "ModelSet",
    "RespondentPrediction",
    "predict_respondents",
    "session_models",
]
