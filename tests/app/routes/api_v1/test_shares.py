"""The JSON API honours study shares (the admin UI's rule, app.auth.can_see_study).

A researcher the study is shared with can create sessions for it with their API key and
read and answer them; a researcher it is not shared with gets 404 for the study and its
sessions; removing the share takes the access away again. SQLite and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import select

from app.auth import share_study
from app.services.apikeys import create_api_key, create_researcher
from app.tables import Study, StudyShare
from tests.support.live_study import LiveStudy, app_client, ces_sample_study


@pytest.fixture(params=["sqlite", "postgresql"])
def live(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LiveStudy]:
    yield from ces_sample_study(request.param, tmp_path, 60, n_classes=(2,))


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_shared_researcher_uses_the_study_others_get_404(live: LiveStudy) -> None:
    with live.session() as db:
        create_researcher("shared@example.org", session=db)
        shared_key = create_api_key("shared@example.org", session=db).key
        study = db.get(Study, live.study_id)
        assert study is not None
        share_study(study, "shared@example.org", session=db)
    url = f"/api/v1/studies/{live.slug}/sessions"
    with app_client(live.url) as client:
        created = client.post(url, json={}, headers=bearer(shared_key))
        assert created.status_code == 201, created.text
        body: dict[str, Any] = created.json()
        sid = body["session_id"]
        assert client.get(f"/api/v1/sessions/{sid}", headers=bearer(shared_key)).status_code == 200
        pred = client.get(f"/api/v1/sessions/{sid}/predictions", headers=bearer(shared_key))
        assert pred.status_code == 200
        q = body["question"]
        answered = client.post(
            f"/api/v1/sessions/{sid}/answers",
            json={"item": q["item"], "option": q["options"][0]["letter"], "idempotency_key": "s1"},
            headers=bearer(shared_key),
        )
        assert answered.status_code == 200, answered.text
        assert answered.json()["questions_answered"] == 1

        # a researcher the study is not shared with: 404 for the study and its sessions
        other = client.post(url, json={}, headers=bearer(live.other_key))
        assert other.status_code == 404 and other.json()["code"] == "study_not_found"
        seen = client.get(f"/api/v1/sessions/{sid}", headers=bearer(live.other_key))
        assert seen.status_code == 404
        # the owner still sees the session made through the share
        assert (
            client.get(f"/api/v1/sessions/{sid}", headers=bearer(live.owner_key)).status_code == 200
        )

        # removing the share removes the access
        with live.session() as db:
            for row in db.exec(select(StudyShare)).all():
                db.delete(row)
            db.commit()
        gone = client.post(url, json={}, headers=bearer(shared_key))
        assert gone.status_code == 404 and gone.json()["code"] == "study_not_found"
        assert client.get(f"/api/v1/sessions/{sid}", headers=bearer(shared_key)).status_code == 404
