"""The live loop of a respondent's adaptive session: start, answer, next question, read, erase.

The path of an answer, from the route to the chosen next question:

1. ``POST /s/{slug}/answer`` (:mod:`app.routes.respondent`) and the API's
   ``POST /api/v1/sessions/{id}/answers`` (:mod:`app.routes.api_v1`) call
   :func:`~app.session.submit.submit_answer`; on PostgreSQL the API call first runs
   :func:`~app.session.async_path.submit_answer` in the event loop, which hands anything
   unusual to it in the thread pool.
2. ``submit_answer`` checks the item and option, tries the fast path
   (:func:`~app.session.fast.submit_fast`: unlocked reads, one write conditional on
   ``state_version``) and otherwise the locked path
   (:func:`~app.session.locked.submit_locked`: one transaction under the session's lock).
3. The fast paths' model step is :func:`~app.session.decide.model_step`: a hit of the step
   memo (:class:`~app.session.memo.StepMemo`), or the state updated with the answer and
   then :func:`~app.session.decide.decide_next`; the locked path updates the state and
   calls ``decide_next`` itself.
4. ``decide_next`` runs :func:`elicitation.session.decide` with the study runtime's
   criterion (:func:`~app.session.runtime.criterion_selector` and its fallbacks) and
   budget; the decision is stored with the answer and the state, and the route renders
   the returned :class:`~app.session.views.SessionView` (the next question, or done).

Modules: :mod:`~app.session.tokens` (session tokens, completion codes),
:mod:`~app.session.runtime` (the cached study runtime, criterion fallbacks),
:mod:`~app.session.state` (state bytes and replay), :mod:`~app.session.decide` (one
selection step), :mod:`~app.session.memo` (the step memo), :mod:`~app.session.sql` (raw
SQL and row objects), :mod:`~app.session.start`, :mod:`~app.session.submit`,
:mod:`~app.session.fast`, :mod:`~app.session.locked`, :mod:`~app.session.async_path`
(the answer paths), :mod:`~app.session.views` (what the routes show),
:mod:`~app.session.erasure`, :mod:`~app.session.errors`.

Invariants, on SQLite and PostgreSQL with any number of worker processes:

1. the answer row is stored in the same transaction as the state and the decision that
   follow from it, so nothing is acknowledged before all three are committed (unique per
   session and item, and per session and idempotency key);
2. the cached state (``elicitation_session.state``) equals the replay of the stored
   answers (:func:`elicitation.session.replay_state`): ``state_version`` counts the
   answers it includes, and a state whose version is not the number of answers is never
   used;
3. every decision is stored with every candidate's score (``selection_decision``, unique
   per session and position);
4. answers are idempotent per idempotency key and per item; a different answer to the
   same key or item, or an answer to an item that is not the pending question, is a
   conflict (409).
"""

from __future__ import annotations

from app.session.erasure import (
    ErasureResult,
    erase_respondent,
    erase_respondent_id,
    found_by_code,
    session_by_completion_code,
)
from app.session.errors import (
    AnswerConflictError,
    ExternalIdTakenError,
    InvalidAnswerError,
    InvalidAttributesError,
    ItemNotFoundError,
    NotCurrentQuestionError,
    SessionClosedError,
    SessionNotFoundError,
    StudyClosedError,
    StudyMisconfiguredError,
    StudyNotFoundError,
)
from app.session.locked import locked_session
from app.session.runtime import (
    FALLBACK_CRITERION,
    ORDER_FALLBACK_CRITERION,
    ItemInfo,
    StudyRuntime,
    clear_runtime_cache,
    configure_step_memo,
    load_runtime,
    peek_runtime,
    session_runtime,
    study_settings,
)
from app.session.sql import (
    SessionSnapshot,
    StudyHead,
    read_session,
    read_session_by_token,
)
from app.session.start import (
    StartedSession,
    clean_panel_params,
    start_session,
    store_attribute_page,
    submit_attributes,
)
from app.session.state import (
    answer_pairs,
    answers_of,
    attribute_indices,
    current_state,
    dump_state,
    load_state,
    replay,
    respondent_and_answers,
    states_equal,
)
from app.session.submit import finish_session, submit_answer
from app.session.tokens import completion_code, hash_token, new_token, session_completion_code
from app.session.views import (
    ATTRIBUTES_PER_PAGE,
    AnswerRecord,
    Prediction,
    Predictions,
    QuestionView,
    SessionView,
    StoredSummary,
    attribute_pages,
    attribute_question,
    explanation,
    get_session_by_token,
    predictions,
    respondent_attributes,
    session_answers,
    session_view,
    stored_summary,
)

__all__ = [
    "ATTRIBUTES_PER_PAGE",
    "FALLBACK_CRITERION",
    "ORDER_FALLBACK_CRITERION",
    "AnswerConflictError",
    "AnswerRecord",
    "ErasureResult",
    "ExternalIdTakenError",
    "InvalidAnswerError",
    "InvalidAttributesError",
    "ItemInfo",
    "ItemNotFoundError",
    "NotCurrentQuestionError",
    "Prediction",
    "Predictions",
    "QuestionView",
    "SessionClosedError",
    "SessionNotFoundError",
    "SessionSnapshot",
    "SessionView",
    "StartedSession",
    "StoredSummary",
    "StudyClosedError",
    "StudyHead",
    "StudyMisconfiguredError",
    "StudyNotFoundError",
    "StudyRuntime",
    "answer_pairs",
    "answers_of",
    "attribute_indices",
    "attribute_pages",
    "attribute_question",
    "clean_panel_params",
    "clear_runtime_cache",
    "completion_code",
    "configure_step_memo",
    "current_state",
    "dump_state",
    "erase_respondent",
    "erase_respondent_id",
    "explanation",
    "found_by_code",
    "get_session_by_token",
    "hash_token",
    "load_runtime",
    "load_state",
    "locked_session",
    "new_token",
    "peek_runtime",
    "session_runtime",
    "predictions",
    "read_session",
    "read_session_by_token",
    "replay",
    "respondent_attributes",
    "respondent_and_answers",
    "session_answers",
    "session_by_completion_code",
    "session_completion_code",
    "session_view",
    "start_session",
    "store_attribute_page",
    "states_equal",
    "stored_summary",
    "study_settings",
    "submit_answer",
    "finish_session",
    "submit_attributes",
]
