"""Cold start from personas in a real headless Chromium against ``priorly serve`` in a
real process, the inference server being a real HTTP server speaking the OpenAI API
(tests/inference_server's test double) configured through ``PRIORLY_LLM_BASE_URL``.

Publishing a study without history shows the uniform-prior warning; on the personas page
a share table that does not sum to 1 is refused with the attribute named and nothing
stored; valid shares give the 4 weighted profiles; generation with the configured server
scores every persona x question pair; the fit job then stores a persona prior that
conditions on the attributes, and the warning is gone. axe-core on each page,
screenshots into ``docs/screenshots/admin/``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.browser import SCREENSHOTS, admin_page, axe_violations, shot
from tests.support.live_study import priorly_serve

SHOTS = SCREENSHOTS / "admin"
EMAIL, PASSWORD = "personas@example.org", "e2e personas password"
SLUG = "cold-start"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """``priorly serve --no-demo`` on a fresh SQLite file with a draft study (attributes
    age and region, two questions, a consent text) and the fake inference server."""
    from sqlmodel import Session

    from app.auth import create_account
    from app.db import make_engine, upgrade
    from app.services.designer import add_item, create_study, update_texts
    from inference_server.model_store import DEFAULT_MODEL
    from tests.support.fake_vllm import FakeVLLM

    folder = tmp_path_factory.mktemp("personas-e2e")
    url = f"sqlite:///{folder / 'personas.db'}"
    upgrade(url)
    engine = make_engine(url)
    with Session(engine) as db:
        owner = create_account(EMAIL, PASSWORD, session=db, is_admin=False)
        st = create_study("Cold start", owner=owner, session=db)
        items = [
            ("age", "Your age?", "A: Under 40\nB: 40 or older", "attribute", "Age"),
            ("region", "Your region?", "A: North\nB: South", "attribute", "Region"),
            ("q1", "Do you trust parliament?", "A: Yes\nB: No", "question", ""),
            ("q2", "Do you trust the courts?", "A: Yes\nB: No", "question", ""),
        ]
        for key, q, opts, role, topic in items:
            add_item(st, session=db, key=key, question=q, options_text=opts, role=role,
                     topic=topic, is_preference_criterion=False)  # fmt: skip
        update_texts(st, session=db, name="Cold start", description="", completion_code="",
                     consent_text="You agree to answer.", redirect_url="")  # fmt: skip
        assert st.slug == SLUG
    fake = FakeVLLM()
    try:
        with priorly_serve(
            url, folder, PRIORLY_LLM_BASE_URL=fake.url, PRIORLY_LLM_MODEL=DEFAULT_MODEL
        ) as base:
            yield {"base": base, "engine": engine, "fake": fake}
    finally:
        fake.close()
        engine.dispose()


@pytest.fixture(scope="module")
def page(server: dict[str, Any], browser: Any) -> Any:
    """A page logged in as the study's owner."""
    return admin_page(browser, server["base"], EMAIL, PASSWORD)


def _fill_shares(page: Any, shares: dict[str, dict[str, str]]) -> None:
    for key, values in shares.items():
        for letter, v in values.items():
            page.fill(f"input[name='share:{key}:{letter}']", v)


def test_cold_start_from_attribute_shares(server: dict[str, Any], page: Any) -> None:
    from sqlmodel import Session, select

    from app.tables import FittedModel, PersonaDistribution, StudyPersona

    base, engine = server["base"], server["engine"]
    page.goto(f"{base}/admin/studies/{SLUG}")
    page.click("button[name=status][value=published]")
    page.wait_for_selector("#prior-warning")
    warning = page.locator("#prior-warning").inner_text()
    assert "prior is uniform" in warning and "Personas" in warning and "Import" in warning
    assert axe_violations(page) == []
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.locator("section:has(#prior-warning)").screenshot(
        path=str(SHOTS / "27-uniform-prior-warning.png")
    )

    page.click("nav.tabs >> text=Personas")
    page.wait_for_url(f"{base}/admin/studies/{SLUG}/personas")
    assert "prior is uniform" in page.locator("#prior-warning").inner_text()
    server_radio = page.locator("input[name=backend][value=openai]")
    assert server_radio.is_enabled()
    assert server["fake"].url in page.locator("#persona-generate-form").inner_text()
    assert axe_violations(page) == []

    # shares that do not sum to one: refused, the attribute named, nothing stored
    _fill_shares(page, {"age": {"A": "0.4", "B": "0.5"}, "region": {"A": "0.5", "B": "0.5"}})
    page.click("#persona-shares-form button[type=submit]")
    page.wait_for_selector("[role=alert]")
    assert "shares of Age (age) sum to 0.9, not 1" in page.locator("[role=alert]").inner_text()
    with Session(engine) as db:
        assert db.exec(select(StudyPersona)).all() == []

    _fill_shares(page, {"age": {"A": "0.4", "B": "0.6"}, "region": {"A": "0.5", "B": "0.5"}})
    page.click("#persona-shares-form button[type=submit]")
    page.wait_for_selector("text=4 personas added from attribute shares")
    rows = page.locator("#persona-table tbody tr")
    assert rows.count() == 4
    assert "Age: 40 or older; Region: South." in rows.nth(3).inner_text()

    assert server_radio.is_checked()  # the configured server is the default
    page.click("#persona-generate-form button[type=submit]")
    page.wait_for_selector(".job[data-status=succeeded]", timeout=60_000)
    summary = page.locator(".job[data-status=succeeded]").first.inner_text()
    assert "8 persona × question pairs scored" in summary
    assert "SmolLM2-135M-Instruct" in summary
    page.goto(f"{base}/admin/studies/{SLUG}/personas")
    assert "4 with an attribute profile, 4 with" in page.locator("#persona-counts").inner_text()
    assert page.locator("#prior-warning").count() == 0  # distributions stored
    assert axe_violations(page) == []
    shot(page, SHOTS, "26-personas")
    with Session(engine) as db:
        assert len(db.exec(select(PersonaDistribution)).all()) == 8

    page.click("nav.tabs >> text=Jobs")
    page.click("button:has-text('Fit the belief model')")
    page.wait_for_selector(".job[data-status=succeeded] >> text=Fitted", timeout=60_000)
    with Session(engine) as db:
        model = db.exec(select(FittedModel).where(FittedModel.is_active)).one()  # type: ignore[arg-type]
        assert model.metrics["prior"] == "persona"
        assert (model.metrics["n_personas"], model.metrics["distributions"]) == (4, 8)
        assert model.metrics["attribute_personas"] == 4
    page.goto(f"{base}/admin/studies/{SLUG}")
    assert page.locator("#prior-warning").count() == 0
