"""The first decision of a session is computed once per runtime and attribute set.

Session starts with the same known attributes share the prior state and the first
decision (a pure function of the study's runtime and the attributes), so a burst of starts
costs no model work. Checked on both backends through the API: the selection step runs
once for two starts with the same attributes and again for other attributes; the stored
decisions and states equal what an uncached computation gives; ``random`` (seeded per
session) is never cached.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlmodel import select

from app import session as svc
from app.session import decide as session_decide
from app.session import runtime as session_runtime
from app.tables import ElicitationSession, SelectionDecision, Study
from elicitation.session import replay_state
from tests.support.live_study import (
    LiveStudy,
    app_client,
    ces_sample_study,
    count_decisions,
    study_settings,
)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def live(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveStudy]:
    folder = tmp_path_factory.mktemp(f"first_decision_{request.param}")
    yield from ces_sample_study(request.param, folder, 60)


def _start(client: Any, live: LiveStudy, attributes: dict[str, str]) -> dict[str, Any]:
    r = client.post(
        f"/api/v1/studies/{live.slug}/sessions",
        json={"attributes": attributes},
        headers={"Authorization": f"Bearer {live.owner_key}"},
    )
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


def _stored(live: LiveStudy, sid: int) -> tuple[bytes, dict[str, Any], int | None]:
    with live.session() as db:
        sess = db.get(ElicitationSession, sid)
        d = db.exec(select(SelectionDecision).where(SelectionDecision.session_id == sid)).one()
        assert sess is not None and sess.state is not None
        return sess.state, dict(d.scores), d.item_id


def test_same_attributes_share_one_first_decision(
    live: LiveStudy, monkeypatch: pytest.MonkeyPatch
) -> None:
    with live.session() as db:
        study = db.get(Study, live.study_id)
        rt = svc.load_runtime(study, session=db, fit_if_missing=False)  # type: ignore[arg-type]
    attribute = rt.attributes[0]
    a, b = attribute.options[0][0], attribute.options[1][0]
    monkeypatch.setattr(session_runtime, "RUNTIME_TTL_S", 3600.0)  # one runtime for the whole test
    calls = count_decisions(monkeypatch)
    with app_client(live.url) as client:
        first = _start(client, live, {attribute.key: a})
        n_first = len(calls)
        second = _start(client, live, {attribute.key: a})
        assert len(calls) == n_first, "the second start with the same attributes decided again"
        other = _start(client, live, {attribute.key: b})
        assert len(calls) == n_first + 1
    s1, s2, s3 = (_stored(live, x["session_id"]) for x in (first, second, other))
    assert s1 == s2  # same state blob, same scores, same item
    # what an uncached computation gives for each attribute set
    for stored, letter in ((s1, a), (s3, b)):
        state = replay_state(rt.model, svc.attribute_indices(rt, {attribute.key: letter}), [])
        fresh = session_decide.decide_next(rt, state, 0, [])
        assert stored[0] == svc.dump_state(state)
        assert stored[2] == fresh.item_id
        assert stored[1]["scores"] == fresh.scores["scores"]


def test_random_first_decision_is_not_cached(
    live: LiveStudy, monkeypatch: pytest.MonkeyPatch
) -> None:
    with study_settings(live, criterion="random"):
        calls = count_decisions(monkeypatch)
        with app_client(live.url) as client:
            for _ in range(3):
                _start(client, live, {})
        assert len(calls) == 3
