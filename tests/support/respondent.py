"""A respondent's survey over HTTP (a TestClient or an ``httpx.Client`` on a live server):
consent, the pages of questions about the respondent, every question to the end.

Example::

    consent(client, live)
    about(client, live, {"gender4": "B"})  # the other questions about you: no answer
    code = finish(client, live)  # the completion code
"""

from __future__ import annotations

import re
from typing import Any

from app import session as svc
from app.tables import Study
from tests.support.live_study import LiveStudy


def field(html: str, name: str) -> str:
    """The value of the form field ``name`` in ``html`` (fails if there is none)."""
    m = re.search(rf'name="{name}" value="([^"]*)"', html)
    assert m, f"no field {name!r} in the page"
    return m.group(1)


def first_option(html: str) -> str:
    """The first answer option's value in a question page's ``html``."""
    m = re.search(r'name="option" value="([^"]+)"', html)
    assert m
    return m.group(1)


def consent(client: Any, live: LiveStudy, **params: str) -> Any:
    """Open the study's consent page (panel ``params`` in its query) and agree; returns the
    consent POST's response (not followed)."""
    page = client.get(f"/s/{live.slug}", params=params)
    assert page.status_code == 200 and "Before you start" in page.text
    data = {"choice": "accept", **{f"p_{k}": v for k, v in params.items()}}
    for k, v in params.items():
        assert field(page.text, f"p_{k}") == v
    return client.post(f"/s/{live.slug}/consent", data=data, follow_redirects=False)


def attribute_pages(live: LiveStudy) -> list[list[str]]:
    """The keys of the attribute items on each page of the browser flow."""
    with live.session() as db:
        study = db.get(Study, live.study_id)
        assert study is not None
        rt = svc.load_runtime(study, session=db, fit_if_missing=False)
    return [[it.key for it in page] for page in svc.attribute_pages(rt)]


def about(client: Any, live: LiveStudy, answers: dict[str, str], htmx: bool = False) -> Any:
    """Submit every page of questions about the respondent (keys left out: "prefer not to
    answer"); with no answers at all, skip them all from the first page's prompt."""
    headers = {"HX-Request": "true"} if htmx else {}
    url = f"/s/{live.slug}/about"
    if not answers:
        data = {"page": "1", "skip_all": "1"}
        return client.post(url, data=data, headers=headers, follow_redirects=False)
    r = None
    for number, keys in enumerate(attribute_pages(live), start=1):
        data = {f"a_{k}": answers.get(k, "__skip__") for k in keys}
        r = client.post(
            url, data={**data, "page": str(number)}, headers=headers, follow_redirects=False
        )
        assert r.status_code in (200, 303)
    return r


def finish(client: Any, live: LiveStudy) -> str:
    """Answer every question of this browser's session; returns the completion code."""
    page = client.get(f"/s/{live.slug}/q", follow_redirects=False)
    while page.status_code == 200 and 'name="item"' in page.text:
        data = {
            "item": field(page.text, "item"),
            "option": first_option(page.text),
            "idempotency_key": field(page.text, "idempotency_key"),
        }
        r = client.post(f"/s/{live.slug}/answer", data=data, follow_redirects=False)
        assert r.status_code == 303
        page = client.get(r.headers["location"], follow_redirects=False)
    done = client.get(f"/s/{live.slug}/done")
    assert done.status_code == 200
    m = re.search(r'class="r-code"><strong>([^<]+)</strong>', done.text)
    assert m
    return m.group(1)
