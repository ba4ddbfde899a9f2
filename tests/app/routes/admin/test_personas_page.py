"""The personas page's forms through the app (TestClient, SQLite and PostgreSQL): each
bad input is a 422 naming the place with nothing stored; the server option is disabled
with the reason until PRIORLY_LLM_BASE_URL is set; a cancelled persona job offers Resume."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from app.errors import InvalidInputError
from app.services.designer import add_item, create_study
from app.settings import Settings
from app.tables import Job, JobStatus, Researcher, Study, StudyPersona
from tests.support.admin import csrf, login

BASE = "/admin/studies/persona-page"


@pytest.fixture
def study(db: Session, alice: Researcher) -> Study:
    st = create_study("Persona page", owner=alice, session=db)
    add_item(st, session=db, key="age", question="Your age?", options_text="A: Young\nB: Old",
             role="attribute", topic="Age", is_preference_criterion=False)  # fmt: skip
    add_item(st, session=db, key="q1", question="Trust?", options_text="A: Yes\nB: No",
             role="question", topic="", is_preference_criterion=False)  # fmt: skip
    return st


@pytest.fixture
def ac(client: TestClient, study: Study) -> TestClient:
    login(client, "alice@example.org")
    return client


def _personas(db: Session) -> list[StudyPersona]:
    db.expire_all()
    return list(db.exec(select(StudyPersona).order_by(StudyPersona.id)).all())  # type: ignore[arg-type]


def test_page_and_server_option_disabled_without_settings(ac: TestClient) -> None:
    r = ac.get(BASE + "/personas")
    assert r.status_code == 200
    assert 'name="share:age:A"' in r.text and 'name="share:age:B"' in r.text
    assert 'value="openai" disabled aria-describedby="llm-unset"' in r.text
    assert "set PRIORLY_LLM_BASE_URL and PRIORLY_LLM_MODEL" in r.text
    r = ac.post(BASE + "/personas/generate", data={"backend": "openai", "csrf_token": csrf(ac)})
    assert r.status_code == 422 and "no inference server is configured" in r.text


def test_server_option_names_the_configured_server(
    settings: Settings, study: Study, alice: Researcher
) -> None:
    from app.main import create_app

    s = settings.model_copy(
        update={"llm_base_url": "http://gpu-box:8000/v1", "llm_model": "Qwen/Qwen3-8B"}
    )
    with TestClient(create_app(s), base_url="http://localhost") as c:
        login(c, "alice@example.org")
        r = c.get(BASE + "/personas")
    assert "<code>http://gpu-box:8000/v1</code> serving <code>Qwen/Qwen3-8B</code>" in r.text
    assert 'value="openai" checked' in r.text


@pytest.mark.parametrize(
    ("path", "data", "files", "message"),
    [
        ("shares", {"share:age:A": "0.3", "share:age:B": "0.3"}, None,
         "shares of Age (age) sum to 0.6, not 1"),
        ("shares", {"share:age:A": "1", "share:age:B": "x"}, None,
         "shares of Age (age), option B: &#39;x&#39; is not a number"),
        ("shares", {}, None, "give the shares of at least one attribute"),
        ("shares", {"share:age:A": "0.5", "share:age:B": "0.5", "share:age:C": "0.5"}, None,
         "shares of Age (age), option C: not an option of age (A, B)"),
        ("shares", {"share:age:A": "0.5", "share:age:B": "0.5", "share:q1:A": "1"}, None,
         "form field share:q1:A: q1 is not an attribute item of this study (attributes: age)"),
        ("shares", {"share:age:A": "0.5", "share:age:B": "0.5", "share:nosuch:A": "1"}, None,
         "form field share:nosuch:A: nosuch is not an attribute item"),
        ("shares", {"share:age:A": "\uff10.\uff13", "share:age:B": "0.7"}, None,
         "option A: &#39;\uff10.\uff13&#39; is not a number: write it with the ASCII digits 0-9"),
        ("shares", {"share:age:A": "\u0660.\u0663", "share:age:B": "0.7"}, None,
         "option A: &#39;\u0660.\u0663&#39; is not a number: write it with the ASCII digits"),
        ("shares", {"share:age:A": "100"}, None,
         "shares of Age (age), option B: blank while other options have a share"),
        ("texts", {"texts": ""}, None, "persona texts: no persona texts"),
        ("texts", {}, {"file": ("p.jsonl", b'{"text": "A"}\n{"text": 3}\n', "text/plain")},
         "p.jsonl line 2: persona text must be a string"),
        ("texts", {}, {"file": ("p.txt", b"\xff\xfe", "text/plain")}, "p.txt: not UTF-8 text"),
        ("texts", {}, {"file": ("p.csv", b"name,age\nA nurse,40\n", "text/csv")},
         "p.csv: not a persona file: choose a .txt (one persona per line), .jsonl or .json file"),
        ("texts", {"texts": "A nurse"}, {"file": ("p.txt", b"A farmer\n", "text/plain")},
         "both the text box and a file (p.txt) are filled in: clear the text box to add the "
         "file, or remove the file to add the typed texts"),
        ("texts", {}, {"file": ("p.jsonl", b'{"text": "A", "key": {"a": 1}}\n', "text/plain")},
         "p.jsonl line 1: key must be a string, got an object"),
        ("texts", {}, {"file": ("p.jsonl", b'{"text": "A", "key": "' + b"k" * 5000 + b'"}\n', "x")},
         "p.jsonl line 1: key has 5,000 characters (at most 190)"),
        ("texts", {"texts": '{"text": "A nurse"}\n{"text": "A \\ud800 pilot"}'}, None,
         "persona texts line 2: persona text contains a lone surrogate (U+D800) at position 2"),
        ("respondents", {}, None,
         "imported respondents: no respondent has any of the attributes age</p>"),
        ("generate", {"backend": "local"}, None, "the persona dictionary is empty"),
    ],
)  # fmt: skip
def test_bad_input_is_422_naming_the_place_and_stores_nothing(
    ac: TestClient, db: Session, path: str, data: dict, files: dict | None, message: str
) -> None:
    r = ac.post(f"{BASE}/personas/{path}", data={**data, "csrf_token": csrf(ac)}, files=files)
    assert r.status_code == 422 and message in r.text, r.text[-2000:]
    assert 'role="alert"' in r.text
    assert _personas(db) == [] and db.exec(select(Job)).all() == []


def test_keys_at_the_limit_are_kept_whole_and_only_newlines_split_texts(
    ac: TestClient, db: Session
) -> None:
    """A key of 190 characters is stored whole, and given again gets its ``~2`` suffix
    within the column's 200 (PostgreSQL checks the length); a U+2028 in a typed text does
    not split it into two personas, ``\\r\\n`` does."""
    key = "k" * 190
    for text in ("A nurse", "A pilot"):
        line = (json.dumps({"text": text, "key": key}) + "\n").encode()
        r = ac.post(BASE + "/personas/texts", data={"csrf_token": csrf(ac)},
                    files={"file": ("p.jsonl", line, "text/plain")})  # fmt: skip
        assert "1 persona added from persona texts" in r.text, r.text[-2000:]
    typed = "A farmer\u2028in Leeds\r\nA diver"
    r = ac.post(BASE + "/personas/texts", data={"texts": typed, "csrf_token": csrf(ac)})
    assert "2 personas added from persona texts" in r.text
    got = [(p.key, p.text) for p in _personas(db)]
    assert got == [
        (key, "A nurse"),
        (key + "~2", "A pilot"),
        ("persona-1", "A farmer\u2028in Leeds"),
        ("persona-2", "A diver"),
    ]


def test_a_refused_form_shows_what_was_typed(ac: TestClient) -> None:
    """The shares and the persona texts typed into a refused form are in the page again
    (only in the form that was posted); a reload of the form's address goes to the page."""
    r = ac.post(BASE + "/personas/shares",
                data={"share:age:A": "0.3", "share:age:B": "0.31", "csrf_token": csrf(ac)})  # fmt: skip
    assert r.status_code == 422
    assert 'name="share:age:A" value="0.3"' in r.text and 'value="0.31"' in r.text
    assert '<textarea id="persona-texts" name="texts" rows="5" cols="80"></textarea>' in r.text
    typed = 'A nurse\n{"text": "A <b>pilot</b>"}'
    r = ac.post(BASE + "/personas/texts", data={"texts": typed, "csrf_token": csrf(ac)})
    assert r.status_code == 422
    assert "A nurse\n{&#34;text&#34;: &#34;A &lt;b&gt;pilot&lt;/b&gt;&#34;}</textarea>" in r.text
    assert 'name="share:age:A" value=""' in r.text
    r = ac.get(BASE + "/personas/texts", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == BASE + "/personas"


def test_sources_add_personas_and_a_cancelled_job_offers_resume(
    ac: TestClient, db: Session, study: Study
) -> None:
    r = ac.post(
        BASE + "/personas/shares",
        data={"share:age:A": "0.25", "share:age:B": "0.75", "csrf_token": csrf(ac)},
    )
    assert r.status_code == 200 and "2 personas added from attribute shares" in r.text
    r = ac.post(
        BASE + "/personas/texts",
        data={"csrf_token": csrf(ac)},
        files={"file": ("p.jsonl", b'{"text": "A nurse", "key": "nurse", "weight": 2}\n', "x")},
    )
    assert "1 persona added from persona texts" in r.text
    got = [(p.key, p.source, p.weight, p.attributes) for p in _personas(db)]
    assert got == [
        ("profile-1", "shares", 0.25, {"age": "A"}),
        ("profile-2", "shares", 0.75, {"age": "B"}),
        ("nurse", "texts", 2.0, {}),
    ]
    # shares weigh 1 in all, the text 2: the page says so
    assert "weight by source: persona texts 67 %, attribute shares 33 %." in r.text
    db.add(Job(kind="persona_generation", study_id=study.id, payload={"backend": "local"},
               status=JobStatus.cancelled.value, message="cancelled"))  # fmt: skip
    db.commit()
    page = ac.get(BASE + "/personas").text
    assert "Resume" in page and 'name="backend" value="local"' in page
    assert 'data-confirm="Remove all 3 personas?' in page  # asked first (static/js/confirm.js)
    db.add(Job(kind="persona_generation", study_id=study.id, payload={"backend": "local"},
               status=JobStatus.succeeded.value, result={}))  # fmt: skip
    db.commit()
    assert ">Resume</button>" not in ac.get(BASE + "/personas").text  # only the newest job
    r = ac.post(BASE + "/personas/clear", data={"csrf_token": csrf(ac)})
    assert "3 personas removed" in r.text and _personas(db) == []


def test_the_generate_form_says_what_is_left_to_score(
    ac: TestClient, db: Session, study: Study
) -> None:
    from app.tables import PersonaDistribution

    ac.post(BASE + "/personas/shares",
            data={"share:age:A": "0.25", "share:age:B": "0.75", "csrf_token": csrf(ac)})  # fmt: skip
    from sqlmodel import select

    from app.services.personas import item_prompt_hash
    from app.tables import Item

    page = ac.get(BASE + "/personas").text
    assert "each of the 2 personas × 1 questions that has no stored distribution" in page
    assert "0 of 2 persona × question pairs scored." in page and "no distribution by" not in page
    q1 = db.exec(select(Item).where(Item.study_id == study.id, Item.key == "q1")).one()
    first, second = _personas(db)
    for p, item_hash in ((first, item_prompt_hash(q1)), (second, "an-older-wording")):
        db.add(PersonaDistribution(model_id="m", template_version="v1", persona_hash=p.text_hash,
                                   item_hash=item_hash, probs=[0.5, 0.5], valid_mass=1.0,
                                   flagged=False))  # fmt: skip
    db.commit()
    page = ac.get(BASE + "/personas").text
    assert "2 with language-model distributions; 1 of 2 persona × question pairs scored" in page
    assert "1 of 2 persona × question pairs scored by m." in page
    assert "1 of the 2 pairs have no distribution by m (personas or questions added, or" in page
    # rewording the scored question says its distributions are for the old wording
    r = ac.post(
        f"/admin/studies/{study.slug}/items/{q1.id}",
        data={"question": "Do you trust them?", "csrf_token": csrf(ac)},
        headers={"HX-Request": "true"},
    )
    assert r.status_code == 200, r.text
    assert "the language-model distributions of 1 persona were for the old wording" in r.text
    assert "0 of 2 persona × question pairs scored" in ac.get(BASE + "/personas").text


def test_publishing_with_a_uniform_prior_warns(ac: TestClient, db: Session, study: Study) -> None:
    study.consent_text = "ok"
    db.add(study)
    db.commit()
    r = ac.post(BASE + "/status", data={"status": "published", "csrf_token": csrf(ac)})
    assert r.status_code == 200 and "study published" in r.text
    assert 'id="prior-warning"' in r.text
    assert "prior is uniform: it has no historical respondents" in r.text
    assert f'{BASE}/personas">Personas</a> · <a href=' in r.text


BROWSER = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}
"""What a browser sends with a form."""


def test_oversized_forms_get_the_admin_error_page_naming_the_limit(
    settings: Settings, study: Study, alice: Researcher, db: Session
) -> None:
    """A browser's typed persona list over the 1 MiB limit of a text field is 400 and its
    file over the upload limit 413, each as the admin error page naming the limit (not the
    framework's JSON); a script (no ``text/html`` in ``Accept``) and the JSON API keep the
    JSON answer."""
    from app.main import create_app

    s = settings.model_copy(update={"max_upload_bytes": 2 * 1024 * 1024})
    with TestClient(create_app(s), base_url="http://localhost") as c:
        login(c, "alice@example.org")
        token = csrf(c)
        big_text = "A nurse\n" * (1024 * 1024 // 8 + 1)
        r = c.post(BASE + "/personas/texts", data={"texts": big_text, "csrf_token": token},
                   files={"file": ("", b"", "application/octet-stream")}, headers=BROWSER)  # fmt: skip
        assert r.status_code == 400 and r.headers["content-type"].startswith("text/html")
        assert "<h1>Error 400</h1>" in r.text
        assert "a text field of the form is larger than the limit of 1 MiB" in r.text
        big_file = {"file": ("p.txt", b"A nurse\n" * (3 * 1024 * 1024 // 8), "text/plain")}
        r = c.post(BASE + "/personas/texts", data={"csrf_token": token}, files=big_file,
                   headers=BROWSER)  # fmt: skip
        assert r.status_code == 413 and r.headers["content-type"].startswith("text/html")
        assert "<h1>Error 413</h1>" in r.text and r.headers["connection"] == "close"
        assert "the form is larger than the limit of 2 MiB for this page" in r.text
        r = c.post(BASE + "/personas/texts", data={"csrf_token": token}, files=big_file)
        assert r.status_code == 413 and r.json()["code"] == "payload_too_large"
        r = c.post(BASE + "/personas/texts", data={"texts": big_text, "csrf_token": token},
                   files={"file": ("", b"", "application/octet-stream")})  # fmt: skip
        assert r.status_code == 400 and "exceeded maximum size of 1024KB" in r.json()["detail"]
        r = c.post("/api/v1/studies/persona-page/sessions", content=b"x" * (2 * 1024 * 1024),
                   headers={"Content-Type": "application/json"})  # fmt: skip
        assert r.status_code == 413 and r.json()["code"] == "payload_too_large"
    assert _personas(db) == []


def test_a_dictionary_over_the_limit_is_refused_naming_count_and_limit(
    settings: Settings, study: Study, alice: Researcher, db: Session
) -> None:
    """``PRIORLY_MAX_STUDY_PERSONAS`` (here 3) bounds the dictionary across uploads and
    sources, with nothing stored; the default is 2,000, and a 60,000-line file is refused."""
    from app.main import create_app
    from app.services import personas as ps

    s = settings.model_copy(update={"max_study_personas": 3})
    with TestClient(create_app(s), base_url="http://localhost") as c:
        login(c, "alice@example.org")
        r = c.post(BASE + "/personas/texts", data={"texts": "a\nb\nc\nd", "csrf_token": csrf(c)})
        assert r.status_code == 422 and (
            "the persona dictionary would hold 4 personas (0 stored, 4 new), more than the "
            "limit of 3 per study (PRIORLY_MAX_STUDY_PERSONAS)" in r.text
        )
        r = c.post(BASE + "/personas/texts", data={"texts": "a\nb", "csrf_token": csrf(c)})
        assert "2 personas added" in r.text
        assert 'max="3" id="share-sample"' in r.text
        r = c.post(BASE + "/personas/shares",
                   data={"share:age:A": "0.5", "share:age:B": "0.5", "csrf_token": csrf(c)})  # fmt: skip
        assert r.status_code == 422 and "would hold 4 personas (2 stored, 2 new)" in r.text
        r = c.post(BASE + "/personas/texts", data={"texts": "a\nc", "csrf_token": csrf(c)})
        assert "1 persona added" in r.text  # "a" is stored already: 3 in all
    assert [p.text for p in _personas(db)] == ["a", "b", "c"]
    assert Settings().max_study_personas == 2000
    lines = "\n".join(f"A persona number {i}" for i in range(60_000))
    with pytest.raises(InvalidInputError, match="would hold 60,003 personas .* limit of 2,000"):
        ps.add_text_personas(study, lines, session=db)
    assert len(_personas(db)) == 3


def test_the_generate_form_estimates_the_duration(
    settings: Settings, ac: TestClient, db: Session, study: Study
) -> None:
    """Missing pairs / rate: the embedded model's one-core figure until a job on this
    server measured its own; an inference server's speed is unknown until then."""
    from app.main import create_app

    ac.post(BASE + "/personas/texts", data={"texts": "a\nb\nc", "csrf_token": csrf(ac)})
    page = ac.get(BASE + "/personas").text
    assert (
        "Estimated time: with the embedded model about 2 s (3 pairs at 1.85 pairs/s, the "
        "embedded model&#39;s speed on one core). The job holds a worker" in page
    )
    db.add(Job(kind="persona_generation", study_id=study.id, status=JobStatus.succeeded.value,
               result={"backend": "local", "pairs_per_second": 0.25, "computed": 40}))  # fmt: skip
    db.add(Job(kind="persona_generation", study_id=study.id, status=JobStatus.succeeded.value,
               result={"backend": "openai", "pairs_per_second": 300.0, "computed": 4000,
                       "base_url": "http://elsewhere:8000", "model": "Qwen/Qwen3-8B"}))  # fmt: skip
    db.commit()
    job = db.exec(select(Job).order_by(Job.id)).first()  # type: ignore[arg-type]
    assert job is not None
    page = ac.get(BASE + "/personas").text
    assert f"about 12 s (3 pairs at 0.25 pairs/s, measured by job #{job.id} on this server)" in page
    s = settings.model_copy(
        update={"llm_base_url": "http://gpu-box:8000/v1", "llm_model": "Qwen/Qwen3-8B"}
    )
    with TestClient(create_app(s), base_url="http://localhost") as c:
        login(c, "alice@example.org")
        page = c.get(BASE + "/personas").text
    assert (
        "; with the inference server unknown for 3 pairs: this server&#39;s speed is known "
        "once a generation on it has finished" in page
    )


def test_the_prior_and_the_page_use_the_newest_jobs_model(
    ac: TestClient, db: Session, study: Study
) -> None:
    """Distributions by two models for the study: the persona prior and the page's counts
    use the model of the newest generation job (a cancelled one that stored 1 pair), not
    the one with the most rows; without a job, the one with the most rows."""
    from app.services.belief import persona_prior_model
    from app.services.personas import item_prompt_hash
    from app.tables import Item, PersonaDistribution

    ac.post(BASE + "/personas/shares",
            data={"share:age:A": "0.25", "share:age:B": "0.75", "csrf_token": csrf(ac)})  # fmt: skip
    items = list(db.exec(select(Item).where(Item.study_id == study.id).order_by(Item.position)))  # type: ignore[arg-type]
    q1 = next(it for it in items if it.key == "q1")
    first, second = _personas(db)
    stored = [("big", first, [0.9, 0.1]), ("big", second, [0.8, 0.2]),
              ("server", first, [0.3, 0.7])]  # fmt: skip
    for model, p, probs in stored:
        db.add(PersonaDistribution(model_id=model, template_version="v1", persona_hash=p.text_hash,
                                   item_hash=item_prompt_hash(q1), probs=probs, valid_mass=1.0))  # fmt: skip
    db.commit()

    def prior() -> tuple[str, list[float]]:
        m = persona_prior_model(study, items, session=db)
        return m.metrics["llm"], m.predict(m.initial_state())[items.index(q1), :2].tolist()

    assert "2 of 2 persona × question pairs scored by big." in ac.get(BASE + "/personas").text
    assert prior()[0] == "big"
    db.add(Job(kind="persona_generation", study_id=study.id, status=JobStatus.succeeded.value,
               payload={"backend": "local"}, result={"model_id": "big"}))  # fmt: skip
    db.add(Job(kind="persona_generation", study_id=study.id, status=JobStatus.cancelled.value,
               payload={"backend": "openai", "base_url": "http://gpu:8001", "model": "server"}))  # fmt: skip
    db.add(Job(kind="persona_generation", study_id=study.id, status=JobStatus.failed.value,
               payload={"backend": "openai", "model": "down-model"}))  # stored nothing  # fmt: skip
    db.commit()
    page = ac.get(BASE + "/personas").text
    assert (
        "1 with language-model distributions; 1 of 2 persona × question pairs scored by server."
        in page
    )
    assert (
        "Other models' distributions are stored too (2 pairs by big); the persona prior uses server's"
        in page
    )
    assert "1 of the 2 pairs have no distribution by server" in page
    model, predicted = prior()
    assert model == "server"
    # the first persona's stored row (weight 0.25), the second uniform (weight 0.75)
    assert predicted == pytest.approx([0.25 * 0.3 + 0.75 * 0.5, 0.25 * 0.7 + 0.75 * 0.5])
    notice = persona_prior_model(study, items, session=db).metrics["notice"]
    assert "2 language-model personas scored by server, 1 persona x item distributions" in notice
    assert "distributions by big are stored too and not used" in notice


def test_job_rows_show_failure_cancelling_and_resume_only_when_it_helps(
    ac: TestClient, db: Session, study: Study
) -> None:
    """A job that failed in its checks shows its error, not its last progress message, and
    no Resume (the settings must change first); one that failed while scoring offers Resume;
    a running job asked to cancel says so and has no Cancel button."""
    from app.services.personas import GENERATION_CHECKING

    def row(job: Job) -> str:
        db.add(job)
        db.commit()
        return ac.get(f"{BASE}/jobs/{job.id}").text

    checks = row(Job(kind="persona_generation", study_id=study.id, payload={"backend": "openai"},
                     status=JobStatus.failed.value, message=GENERATION_CHECKING,
                     error="the worker running this job has no PRIORLY_LLM_API_KEY"))  # fmt: skip
    assert "no PRIORLY_LLM_API_KEY" in checks
    assert GENERATION_CHECKING not in checks and ">Resume</button>" not in checks
    scoring = row(Job(kind="persona_generation", study_id=study.id, payload={"backend": "local"},
                      status=JobStatus.failed.value, message="3 of 4 pairs scored",
                      error="inference server: HTTP 500"))  # fmt: skip
    assert ">Resume</button>" in scoring
    running = Job(kind="persona_generation", study_id=study.id, payload={"backend": "local"},
                  status=JobStatus.running.value, message="1 of 4 pairs scored")  # fmt: skip
    assert ">Cancel</button>" in row(running)
    r = ac.post(f"{BASE}/jobs/{running.id}/cancel", data={"csrf_token": csrf(ac)})
    assert r.status_code == 200
    for text in (r.text, ac.get(f"{BASE}/jobs/{running.id}").text):
        assert "cancelling: it stops after the step in progress" in text
        assert ">Cancel</button>" not in text
