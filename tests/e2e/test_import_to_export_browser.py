"""From import to the first export, in a real headless Chromium (Debian's /usr/bin/chromium
through Playwright) against ``priorly serve`` in a real process, counting the researcher's
clicks.

A fresh server with one admin account and no study: the researcher logs in, opens the
import page, chooses the dataset's files (one file choice: the multiple-file field),
previews, imports from the preview, opens the study's exports and downloads the wide CSV
with the imported respondents. The file holds every uploaded respondent with their
answers and demographics; the SPSS file (read afterwards, not a click) gives each answer
its label from the uploaded codebook; a visitor's home page shows nothing of the draft.
Every click and file choice goes through :class:`Clicks`, and the count is
:data:`CLICKS_TO_FIRST_EXPORT`, the figure docs/admin.md gives. axe-core finds no serious
or critical violation on the pages of the flow; the import page with the files chosen
together is docs/screenshots/admin/28-import-files-together.png.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser import DESKTOP, SCREENSHOTS, admin_database, axe_violations
from tests.support.data import DATASETS_DIR, write_small_dataset
from tests.support.live_study import priorly_serve

SHOTS = SCREENSHOTS / "admin"
EMAIL, PASSWORD = "researcher@example.org", "e2e researcher password"
N_RESPONDENTS = 40
SPSS_VALUE_LABEL_MAX = 120  # the .sav format's limit: a longer label is cut

STEPS = (
    "click 'Log in'",
    "click 'Import' (the admin menu)",
    "choose the dataset's files (one file choice)",
    "click 'Preview'",
    "click 'Import this upload'",
    "click 'Export' (the study's tabs)",
    "click 'with imported respondents' (Answers, CSV wide): the download",
)
"""The researcher's steps from the login page to the first export, as docs/admin.md lists
them; typing (email, password) and waiting are not steps."""
CLICKS_TO_FIRST_EXPORT = 7
"""Clicks and file choices from the login page to the first export (docs/admin.md)."""


@dataclass
class Clicks:
    """The researcher's clicks and file choices on ``page``, in order: each call does one
    and records its ``step`` (a line of :data:`STEPS`)."""

    page: Any
    steps: list[str] = field(default_factory=list)

    def click(self, selector: str, step: str) -> None:
        self.page.click(selector)
        self.steps.append(step)

    def choose_files(self, selector: str, paths: list[Path], step: str) -> None:
        self.page.set_input_files(selector, [str(p) for p in paths])
        self.steps.append(step)

    def download(self, selector: str, step: str) -> bytes:
        """Click a download link and return the downloaded file's bytes."""
        with self.page.expect_download() as info:
            self.page.click(selector)
        self.steps.append(step)
        path = info.value.path()
        return Path(path).read_bytes()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """``priorly serve --no-demo`` on a fresh SQLite file with one admin account and no
    study; an OpinionQA upload of :data:`N_RESPONDENTS` respondents in a folder."""
    folder = tmp_path_factory.mktemp("import-export-e2e")
    upload = write_small_dataset(DATASETS_DIR / "opinionqa", folder / "upload", N_RESPONDENTS)
    url = f"sqlite:///{folder / 'flow.db'}"
    admin_database(url, EMAIL, PASSWORD)
    with priorly_serve(url, folder) as base:
        yield {"base": base, "upload": upload}


def _csv(raw: bytes) -> list[dict[str, str]]:
    assert raw.startswith("\ufeff".encode())  # UTF-8 with a BOM, for spreadsheets
    return list(csv.DictReader(io.StringIO(raw.decode("utf-8-sig"))))


def _uploaded(upload: Path) -> dict[str, dict[str, str]]:
    """``{respondent id: {item key: letter}}`` of the uploaded responses.csv (ids as the
    exports write them: ``100260.0`` -> ``100260``)."""
    with (upload / "responses.csv").open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    return {r["caseid"].removesuffix(".0"): {k: v for k, v in r.items() if v} for r in rows}


def test_import_to_first_export_in_seven_clicks(
    server: dict[str, Any], browser: Any, tmp_path: Path
) -> None:
    import pyreadstat

    base, upload = server["base"], server["upload"]
    context = browser.new_context(viewport=DESKTOP)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    clicks = Clicks(page)
    try:
        page.goto(base + "/admin/login")
        page.fill("input[name=email]", EMAIL)
        page.fill("input[name=password]", PASSWORD)
        clicks.click("button[type=submit]", STEPS[0])
        page.wait_for_url(base + "/admin")
        clicks.click("nav.admin-nav >> text=Import", STEPS[1])
        page.wait_for_url(base + "/admin/import")
        files = sorted(upload.iterdir())
        assert [f.name for f in files] == [
            "codebook.jsonl",
            "dataset.json",
            "responses.csv",
            "runs.csv",
            "user_split.json",
        ]
        clicks.choose_files("#import-upload input[name=files]", files, STEPS[2])
        assert axe_violations(page) == []
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.locator("#import-upload").screenshot(path=str(SHOTS / "28-import-files-together.png"))
        clicks.click("#import-upload button[value=preview]", STEPS[3])
        page.wait_for_selector("#preview, [role=alert]")
        assert not page.locator(".error[role=alert]").count(), page.inner_text(".error")
        assert f"{N_RESPONDENTS} respondents" in page.inner_text("#preview")
        assert axe_violations(page) == []
        clicks.click("#import-previewed button[type=submit]", STEPS[4])
        page.wait_for_url(base + "/admin/studies/opinionqa")
        clicks.click("nav.tabs >> text=Export", STEPS[5])
        page.wait_for_url(base + "/admin/studies/opinionqa/export")
        assert axe_violations(page) == []
        wide = _csv(clicks.download("text=with imported respondents", STEPS[6]))
        assert clicks.steps == list(STEPS)
        assert len(clicks.steps) == CLICKS_TO_FIRST_EXPORT

        # the wide CSV: every uploaded respondent once, with their answers
        uploaded = _uploaded(upload)
        assert sorted(r["respondent_id"] for r in wide) == sorted(uploaded)
        for row in wide:
            assert row["source"] == "import"
            given = uploaded[row["respondent_id"]]
            for key, letter in given.items():
                if key != "caseid":
                    assert row[key] == letter, (row["respondent_id"], key)
        # the SPSS file (not a click: read with the page's cookies): the same answers
        # with their labels, "letter: label" as in the uploaded codebook
        got = page.request.get(base + "/admin/studies/opinionqa/export/answers.sav?imported=1")
        assert got.status == 200
        sav = tmp_path / "answers.sav"
        sav.write_bytes(got.body())
        frame, meta = pyreadstat.read_sav(str(sav))
        lines = (upload / "codebook.jsonl").read_text(encoding="utf-8").splitlines()
        codebook = {i["id"]: i["options"] for i in map(json.loads, lines)}
        assert sorted(frame["respondent_id"]) == sorted(uploaded)
        checked = 0
        for _, row in frame.iterrows():
            for key, letter in uploaded[row["respondent_id"]].items():
                if key == "caseid":
                    continue
                label = meta.variable_value_labels[key][int(row[key])]
                want = f"{letter}: {codebook[key][letter]}"[:SPSS_VALUE_LABEL_MAX]
                assert label == want, (key, letter, label)
                checked += 1
        assert checked == sum(len(c) - 1 for c in uploaded.values())
        # a visitor (no cookies) sees no trace of the draft on the public home page
        visitor = browser.new_context().new_page()
        visitor.goto(base + "/")
        body = visitor.inner_text("body")
        assert "There is no open survey here" in body and "opinionqa" not in body.lower()
        assert str(N_RESPONDENTS) not in body
        assert errors == []
    finally:
        context.close()
