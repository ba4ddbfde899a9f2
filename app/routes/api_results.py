"""Results through the JSON API: the studies a researcher's API key may see, and a study's
responses and per-respondent predictions in pages (:mod:`app.services.results`).

Same contract as :mod:`app.routes.api_v1`: ``Authorization: Bearer <API key>``, JSON errors
``{"code", "message"}``, a study the key's researcher may not see answered 404. Pages:
``?limit=`` rows at most and ``next_cursor`` (``null`` after the last page), passed back as
``?cursor=``.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Security
from pydantic import BeforeValidator, Field

from app.deps import SessionDep, plain_number
from app.routes.api_docs import BEARER
from app.routes.api_v1 import _ERRORS, ApiOut, ApiResearcher, ApiRoute, OptionOut, get_owned_study
from app.services import results
from app.services.studies import visible_study_summaries
from app.tables import Study

router = APIRouter(
    prefix="/api/v1",
    tags=["results"],
    route_class=ApiRoute,
    responses=_ERRORS,
    dependencies=[Security(BEARER)],
)

OwnedStudy = Annotated[Study, Depends(get_owned_study)]
Cursor = Annotated[
    str | None,
    Query(
        max_length=200,
        description="the next_cursor of the previous page; none for the first page",
    ),
]


def _limit(listing: results.Listing) -> Any:
    """``?limit=`` of a listing: 1 to its ``max_limit``, in plain digits (:func:`plain_number`)."""
    return Query(
        ge=1,
        le=listing.max_limit,
        description=f"rows per page (1..{listing.max_limit}, default {listing.default_limit})",
    )


# ----- schemas ------------------------------------------------------------------------------


class StudyHeadOut(ApiOut):
    slug: str = Field(examples=["ces"])
    name: str
    status: str = Field(examples=["published"], description="draft, published or closed")


class StudyOut(StudyHeadOut):
    items: int = Field(description="items of the study (questions, targets, attributes)")
    respondents: int = Field(description="respondents, live and imported")


class StudiesOut(ApiOut):
    studies: list[StudyOut] = Field(description="newest first")


class ItemOut(ApiOut):
    key: str = Field(examples=["gender4"])
    role: str = Field(
        examples=["attribute"],
        description="attribute (send it as a session's attributes), question (asked) or "
        "target (predicted)",
    )
    question: str
    topic: str | None = None
    options: list[OptionOut]


class StudyDetailOut(StudyHeadOut):
    max_questions: int = Field(description="the most questions a session asks")
    allow_skip: bool = Field(description="whether an answer may be null (prefer not to answer)")
    items: list[ItemOut] = Field(description="every item, in the study's order")


RESPONDENT_PK = (
    "the respondent's database id: unique in the server, the respondent_id returned when "
    "the session was created"
)


class ResponseAnswerOut(ApiOut):
    item: str = Field(examples=["330a"])
    role: str = Field(examples=["question"])
    option: str | None = Field(description="the option letter; null when skipped")
    label: str | None = Field(description="the option's label; null when skipped")


class ResponseOut(ApiOut):
    respondent_id: str = Field(description="the external id, else r<id> (as in the exports)")
    respondent: int = Field(description=RESPONDENT_PK)
    session_id: int
    source: str = Field(examples=["live"])
    status: str = Field(
        examples=["completed"],
        description="the first session's: active (not finished yet, or left), completed, "
        "or abandoned (a group round closed before the member answered)",
    )
    started_at: str | None = Field(description="ISO 8601 in UTC")
    completed_at: str | None = Field(description="ISO 8601 in UTC")
    earlier_starts: int = Field(
        description="respondents the same browser had started in this study before this one"
    )
    panel: dict[str, str] = Field(
        description="the link parameters the respondent arrived with (the CSV's panel.K)",
        examples=[{"PROLIFIC_PID": "5f3a"}],
    )
    answers: list[ResponseAnswerOut] = Field(description="in the study's item order")


class ResponsesPage(ApiOut):
    study: str
    responses: list[ResponseOut]
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page")


class _PredictionOut(ApiOut):
    item: str
    distribution: dict[str, float] = Field(examples=[{"A": 0.72, "B": 0.28}])
    predicted: str = Field(description="the most probable option's letter")
    label: str = Field(description="the most probable option's label")
    status: str = Field(
        examples=["not asked"], description="answered, skipped or not asked (the respondent)"
    )


class TargetPredictionOut(_PredictionOut):
    answer: str | None = Field(
        description="the respondent's own letter when they answered this target, else null "
        "(the distribution is still the model's posterior predictive)"
    )


class ItemPredictionOut(_PredictionOut):
    probability: float = Field(description="the most probable option's probability")


class RespondentPredictionsOut(ApiOut):
    respondent_id: str = Field(description="the external id, else r<id> (as in the exports)")
    respondent: int = Field(description=RESPONDENT_PK)
    session_id: int = Field(description="the respondent's first session")
    status: str
    answers: int = Field(description="the number of the respondent's answers (skips included)")
    model_id: int | None = Field(
        default=None,
        description="the fitted model of these predictions: the one the respondent's "
        "session in progress uses, else the study's active model",
    )
    targets: list[TargetPredictionOut] = Field(description="every target item")
    items: list[ItemPredictionOut] = Field(
        default_factory=list,
        description="every item without an answer (never asked, skipped or declined; "
        "questions, targets and attributes), in study order",
    )


class PredictionsPage(ApiOut):
    study: str
    predictions: list[RespondentPredictionsOut]
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page")


# ----- routes -------------------------------------------------------------------------------


@router.get(
    "/studies",
    response_model=StudiesOut,
    summary="The studies this API key may see",
    description="The key's researcher's own studies, those shared with them, and every "
    "study for an admin (the admin UI's rule).",
)
def list_studies(researcher: ApiResearcher, session: SessionDep) -> dict[str, Any]:
    rows = visible_study_summaries(researcher, session=session)
    return {
        "studies": [
            {
                "slug": s.slug,
                "name": s.name,
                "status": s.status,
                "items": s.n_items,
                "respondents": s.n_respondents,
            }
            for s in rows
        ]
    }


@router.get(
    "/studies/{slug}",
    response_model=StudyDetailOut,
    summary="A study's items and options: what a session may be given and asked",
    description="Status, question budget, and every item in the study's order with its "
    "role and options: the `attributes` a new session may be given (attribute items, "
    "`{key: letter}`), the questions it may ask and the targets it predicts.",
)
def get_study(study: OwnedStudy, session: SessionDep) -> dict[str, Any]:
    return results.study_description(study, session=session)


@router.get(
    "/studies/{slug}/responses",
    response_model=ResponsesPage,
    summary="A page of the study's responses (one row per live respondent, with labels)",
    description="The rows of the wide CSV export, in respondent order (database ids), each "
    "answer with its option label. Follow next_cursor until it is null.",
)
def list_responses(
    study: OwnedStudy,
    session: SessionDep,
    cursor: Cursor = None,
    limit: Annotated[int | None, BeforeValidator(plain_number), _limit(results.RESPONSES)] = None,
) -> dict[str, Any]:
    page = results.responses_page(study, session=session, cursor=cursor, limit=limit)
    return {"study": study.slug, "responses": page.rows, "next_cursor": page.next_cursor}


@router.get(
    "/studies/{slug}/predictions",
    response_model=PredictionsPage,
    summary="A page of per-respondent predictions for every item they did not answer",
    description="Each live respondent's predicted distribution over every target's options "
    "(the predictions CSV export's numbers) and over every item they did not answer, given "
    "everything they answered, under the model their session in progress uses, else the active model; in respondent order. "
    "Follow next_cursor until it is null.",
)
def list_predictions(
    study: OwnedStudy,
    session: SessionDep,
    cursor: Cursor = None,
    limit: Annotated[int | None, BeforeValidator(plain_number), _limit(results.PREDICTIONS)] = None,
) -> dict[str, Any]:
    page = results.predictions_page(study, session=session, cursor=cursor, limit=limit)
    return {"study": study.slug, "predictions": page.rows, "next_cursor": page.next_cursor}
