"""Property-based fuzzing of the JSON API from its own OpenAPI schema (schemathesis).

A real uvicorn process serves a prepared study (real CES data, a fitted model) on a fresh
SQLite file and on a fresh PostgreSQL database. Schemathesis reads ``/openapi.json`` from
that server and generates requests for every operation (``max_examples`` per operation,
derandomized, so a run is reproducible). Each generated case is sent with one of several
credentials (owner's key, admin's key, another researcher's key, the session's own token,
none, or the header schemathesis generated), and path parameters are, for part of the
cases, replaced by ones that exist (the study's slug, a live session), so the fuzzer reaches
the handlers and not only the 404s. Every response must:

* not be a server error (no 5xx);
* have a status code, content type, headers and body documented in the OpenAPI schema;
* not accept (2xx) data that violates the schema.

Per-operation counts and status codes are written to ``results/security/fuzz-<backend>.json``.
"""

from __future__ import annotations

import json
import time
import zlib
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis import checks as st_checks

from tests.support.data import DATASETS_DIR, REPO_ROOT, write_small_dataset
from tests.support.live_study import LiveStudy, fresh_database_url, make_live_study
from tests.support.secutil import LiveServer, live_server

MAX_EXAMPLES = 20  # positive cases per operation
MAX_NEGATIVE = 10  # schema-violating cases per operation
CHECKS = [
    st_checks.not_a_server_error,
    st_checks.status_code_conformance,
    st_checks.content_type_conformance,
    st_checks.response_headers_conformance,
    st_checks.response_schema_conformance,
    st_checks.negative_data_rejection,
]
RESULTS = REPO_ROOT / "results" / "security"


@dataclass
class Api:
    backend: str
    server: LiveServer
    live: LiveStudy
    stats: dict[str, Counter[str]]
    started: float

    def new_session(self) -> dict[str, Any]:
        r = httpx.post(
            f"{self.server.base}/api/v1/studies/{self.live.slug}/sessions",
            json={},
            headers={"Authorization": f"Bearer {self.live.owner_key}"},
            timeout=30,
        )
        assert r.status_code == 201, r.text
        return r.json()  # type: ignore[no-any-return]


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def api(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    folder = tmp_path_factory.mktemp(f"fuzz-{request.param}")
    urls = fresh_database_url(request.param, folder)
    url = next(urls)  # skips the PostgreSQL case without a server
    try:
        live = make_live_study(url, write_small_dataset(DATASETS_DIR / "ces", folder / "ces", 30))
        live.engine.dispose()
        with live_server(url, folder / "server.log", log_level="warning") as srv:
            api = Api(request.param, srv, live, defaultdict(Counter), time.monotonic())
            yield api
            RESULTS.mkdir(parents=True, exist_ok=True)
            summary = {
                "backend": request.param,
                "max_examples": MAX_EXAMPLES,
                "max_negative_examples": MAX_NEGATIVE,
                "seconds": round(time.monotonic() - api.started, 1),
                "operations": {op: dict(c) for op, c in sorted(api.stats.items())},
                "cases": {op: sum(c.values()) for op, c in sorted(api.stats.items())},
            }
            (RESULTS / f"fuzz-{request.param}.json").write_text(json.dumps(summary, indent=2))
    finally:
        urls.close()


def _choice(case: Any, n: int) -> int:
    """A deterministic choice in ``range(n)`` derived from the generated case."""
    key = repr((case.path_parameters, case.query, case.body, case.headers)).encode()
    return zlib.crc32(key) % n


def _send(case: Any, api: Api, *, negative: bool = False) -> None:
    """Send one generated case with chosen credentials and parameters; check the response.

    A negative case (one part made to violate the schema) keeps its body, and its session
    id unless that id is a valid one (so the violation is never replaced by valid data).
    """
    live = api.live
    pick = _choice(case, 12)
    params = case.path_parameters or {}
    token: str | None = None
    if "slug" in params and pick % 3 != 0:
        params["slug"] = live.slug
    sid = params.get("session_id")
    valid_sid = isinstance(sid, int) and not isinstance(sid, bool) and 1 <= sid < 2**31
    if "session_id" in params and pick % 4 != 0 and (valid_sid or not negative):
        fresh = api.new_session()  # a live session (the case may answer or erase it)
        params["session_id"] = fresh["session_id"]
        token = fresh["token"]
        body = case.body
        if (
            not negative
            and isinstance(body, dict)
            and pick % 2 == 0
            and fresh["question"] is not None
        ):
            body["item"] = fresh["question"]["item"]
            body["option"] = fresh["question"]["options"][0]["letter"]
    credentials = [
        live.owner_key,
        live.owner_key,
        live.admin_key,
        live.other_key,
        token,
        None,
        "generated",
    ]
    credential = credentials[pick % len(credentials)]
    headers = {k: v for k, v in (case.headers or {}).items() if k.lower() != "authorization"}
    if credential == "generated":
        headers = dict(case.headers or {})
    elif credential is not None:
        headers["Authorization"] = f"Bearer {credential}"
    case.headers = headers
    response = case.call(base_url=api.server.base, timeout=60)
    op = f"{case.method.upper()} {case.path}"
    api.stats[op][str(response.status_code)] += 1
    case.validate_response(response, checks=CHECKS)


def _runner(strategy: Any, n: int, api: Api, mode: GenerationMode) -> Any:
    """A hypothesis test sending ``n`` cases drawn from ``strategy`` (derandomized)."""

    @settings(
        max_examples=n,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def run(case: Any) -> None:
        _send(case, api, negative=mode is GenerationMode.NEGATIVE)

    return run


def test_api_fuzz(api: Api) -> None:
    """Every operation of the served schema, ``MAX_EXAMPLES`` generated cases each."""
    loaded = schemathesis.openapi.from_url(f"{api.server.base}/openapi.json")
    operations = [result.ok() for result in loaded.get_all_operations()]
    api_ops = {f"{o.method.upper()} {o.path}" for o in operations if o.path.startswith("/api/v1")}
    assert len(api_ops) >= 7, sorted(api_ops)
    failures: list[str] = []
    for operation in operations:
        for mode, n in (
            (GenerationMode.POSITIVE, MAX_EXAMPLES),
            (GenerationMode.NEGATIVE, MAX_NEGATIVE),
        ):
            run = _runner(operation.as_strategy(generation_mode=mode), n, api, mode)
            try:
                run()
            except Unsatisfiable:
                assert mode is GenerationMode.NEGATIVE  # nothing in it can be made invalid
            except (Exception, BaseExceptionGroup) as exc:  # collect every failure, fail once
                failures.append(
                    f"{operation.method.upper()} {operation.path} ({mode.value}): {exc}"
                )
    assert not failures, "\n\n".join(failures)


@pytest.mark.parametrize(
    "session_id",
    ["565748284166", str(2**63), "0", "-1", "1e3", "x", "1%20", "%201", "01", "+1", "1.0", "1_0"],
)
def test_out_of_range_session_id_is_422_not_500(api: Api, session_id: str) -> None:
    """Found by the fuzzer: an id beyond the 32-bit INTEGER column was a 500 on PostgreSQL.
    An id that ``int`` reads but that is not plain digits (``1%20``, ``+1``, ``1_0`` read as
    10) is refused too."""
    for method, suffix in (("GET", ""), ("POST", "/answers"), ("DELETE", "")):
        r = httpx.request(
            method,
            f"{api.server.base}/api/v1/sessions/{session_id}{suffix}",
            json={"item": "a", "option": "A", "idempotency_key": "k"} if method == "POST" else None,
            headers={"Authorization": f"Bearer {api.live.owner_key}"},
            timeout=30,
        )
        assert r.status_code == 422, (method, session_id, r.status_code, r.text)
        assert r.json()["code"] == "invalid_input"
