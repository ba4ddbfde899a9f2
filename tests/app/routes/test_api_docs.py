"""The API's documentation on a real uvicorn server: /api/docs names no other site and its
Swagger UI files are served by the server; the OpenAPI document declares the bearer scheme
on every /api/v1 call; the first-session page's commands (the same as in docs/api.md) run
with bash, curl, jq and the real ``priorly`` command against the demo study.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import httpx
import pytest
from sqlmodel import Session, select

from app.routes.api_docs import first_session_script
from app.routes.api_v1 import ERROR_CODES
from app.tables import Answer, ElicitationSession, Respondent
from tests.support.data import DATASETS_DIR, REPO_ROOT, write_small_dataset
from tests.support.live_study import LiveStudy, make_live_study, uvicorn_server

DOCS_MD = REPO_ROOT / "docs" / "api.md"


class Links(HTMLParser):
    """Every ``src`` and ``href`` of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.urls += [v for k, v in attrs if k in ("src", "href") and v]


def links(page: str) -> list[str]:
    parser = Links()
    parser.feed(page)
    return parser.urls


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, LiveStudy]]:
    """uvicorn serving a small copy of the demo dataset (slug ``ces``, as the demo's)."""
    folder = tmp_path_factory.mktemp("apidocs")
    url = f"sqlite:///{folder / 'docs.db'}"
    live = make_live_study(url, write_small_dataset(DATASETS_DIR / "ces", folder / "ces", 120))
    try:
        with uvicorn_server(url, folder / "uvicorn.log") as base:
            yield base, live
    finally:
        live.engine.dispose()


def test_docs_page_uses_only_this_server_and_its_assets_are_served(
    server: tuple[str, LiveStudy],
) -> None:
    base, _live = server
    r = httpx.get(f"{base}/api/docs")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in r.headers["content-security-policy"]
    assert "<script>" not in r.text, "no inline script (the CSP forbids it)"
    urls = links(r.text)
    assert urls
    for url in urls:
        full = urljoin(f"{base}/api/docs", url)
        assert urlsplit(full).netloc == urlsplit(base).netloc, f"another site: {url}"
    assert not re.search(r"https?://(?!127\.0\.0\.1:)", r.text), "a URL of another site"
    assets = [u for u in urls if "/api/docs/assets/" in u or "/static/" in u]
    kinds = {Path(urlsplit(u).path).name for u in assets}
    assert {"swagger-ui-bundle.js", "swagger-ui.css", "api-docs.js"} <= kinds
    for url in assets:
        got = httpx.get(urljoin(base, url))
        assert got.status_code == 200, url
        assert len(got.content) > 100, url
        if url.split("?")[0].endswith(".js"):
            assert "javascript" in got.headers["content-type"]
    bundle = httpx.get(f"{base}/api/docs/assets/swagger-ui-bundle.js")
    assert "SwaggerUIBundle" in bundle.text and "max-age" in bundle.headers["cache-control"]
    assert httpx.get(f"{base}/api/docs/assets/index.html").status_code == 404
    assert httpx.get(f"{base}/api/docs/assets/..%2Fcore.py").status_code == 404


def test_openapi_declares_the_bearer_scheme_on_every_api_call(
    server: tuple[str, LiveStudy],
) -> None:
    base, _live = server
    spec = httpx.get(f"{base}/openapi.json").json()
    scheme = spec["components"]["securitySchemes"]["bearer"]
    assert scheme["type"] == "http" and scheme["scheme"] == "bearer"
    operations = [
        (path, method, op)
        for path, item in spec["paths"].items()
        if path.startswith("/api/v1/")
        for method, op in item.items()
    ]
    assert len(operations) >= 10
    for path, method, op in operations:
        assert {"bearer": []} in op.get("security", []), f"{method} {path}"
    for path in ("/api/v1/studies", "/api/v1/studies/{slug}/responses"):
        assert path in spec["paths"]
    assert not any(p.startswith("/api/docs") for p in spec["paths"])
    assert "/" not in spec["paths"]  # the home page is HTML, not an API call
    # one operation id per operation (a HEAD route beside a GET repeated one)
    ids = [op["operationId"] for item in spec["paths"].values() for op in item.values()]
    assert len(ids) == len(set(ids))
    # a field every reply has is required, so a generated client does not make it optional
    schemas = spec["components"]["schemas"]
    for name, field in (
        ("SessionOut", "stop_reason"),
        ("SessionCreated", "stop_reason"),
        ("PredictionsOut", "model_id"),
        ("PredictionsOut", "predicted"),
        ("RespondentPredictionsOut", "items"),
        ("ErasedOut", "erased"),
        ("AnswerReplyOut", "replayed"),
        ("ProfileOut", "predicted"),
    ):
        assert field in schemas[name]["required"], (name, field)
    # the answer's reply says whether it is a replay, in its body and in a header
    answer_ok = spec["paths"]["/api/v1/sessions/{session_id}/answers"]["post"]["responses"]["200"]
    assert answer_ok["content"]["application/json"]["schema"]["$ref"].endswith("/AnswerReplyOut")
    assert schemas["AnswerReplyOut"]["properties"]["replayed"]["description"]
    assert "Idempotent-Replayed" in answer_ok["headers"]
    # the error codes are the documented ones, and 405 is declared with them
    assert schemas["ErrorOut"]["properties"]["code"]["enum"] == sorted(ERROR_CODES)
    assert "405" in spec["paths"]["/api/v1/sessions/{session_id}"]["get"]["responses"]


def _page_script(page: str) -> str:
    match = re.search(r'<pre class="walkthrough"><code>(.*?)</code></pre>', page, re.S)
    assert match, "the first-session page shows its commands"
    return html.unescape(match.group(1))


def _bash_blocks(markdown: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", markdown, re.S)


def test_first_session_commands_run_against_the_demo_study(
    server: tuple[str, LiveStudy], tmp_path: Path
) -> None:
    base, live = server
    docs = httpx.get(f"{base}/api/docs")
    assert "/api/docs/first-session" in docs.text, "the reference links the walkthrough"
    page = httpx.get(f"{base}/api/docs/first-session")
    assert page.status_code == 200
    script = _page_script(page.text)
    assert script == first_session_script(base)
    assert f"BASE={base}" in script and "STUDY=ces" in script and live.slug == "ces"
    # docs/api.md shows the same commands (for the default address) and a paging loop
    blocks = _bash_blocks(DOCS_MD.read_text(encoding="utf-8"))
    assert blocks[0] == first_session_script()
    paging = blocks[1]
    for tool in ("bash", "curl", "jq"):
        assert shutil.which(tool), f"{tool} is needed by the walkthrough"
    env = {
        **os.environ,
        "PRIORLY_DATABASE_URL": live.url,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    run = subprocess.run(
        ["bash", "-e", "-u", "-o", "pipefail", "-c", script + "\n" + paging],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    print(run.stdout, run.stderr)
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    created = json.loads((tmp_path / "session.json").read_text())
    assert created["token"] and created["question"]["options"]
    question = json.loads((tmp_path / "question.json").read_text())["question"]
    assert question["item"] == created["question"]["item"]
    assert '{"key":"gender4","options":["A","B","C","D"]}' in out  # step 2: the attributes
    assert '"questions_answered": 1' in out  # step 5's reply
    assert '"summary"' in out and '"distribution"' in out  # step 6
    assert '"slug": "ces"' in out  # step 7
    with Session(live.engine) as db:
        sess = db.get(ElicitationSession, created["session_id"])
        assert sess is not None
        respondent = db.get(Respondent, sess.respondent_id)
        assert respondent is not None and re.fullmatch(r"curl-\d+", respondent.external_id or "")
        answers = db.exec(select(Answer).where(Answer.session_id == sess.id)).all()
        assert [a.option for a in answers] == [question["options"][0]["letter"]]
        n_sessions = len(
            db.exec(
                select(ElicitationSession).where(ElicitationSession.study_id == live.study_id)
            ).all()
        )
    # the paging loop of docs/api.md wrote every session once
    lines = (tmp_path / "responses.jsonl").read_text().splitlines()
    ids = [json.loads(x)["session_id"] for x in lines]
    assert len(ids) == len(set(ids)) == n_sessions >= 1
