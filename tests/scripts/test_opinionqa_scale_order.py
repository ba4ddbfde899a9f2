"""The shipped OpinionQA codebook lists options in scale order, and
``scripts/opinionqa_scale_order.py`` (which put them there) recodes answers by label."""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path
from types import ModuleType

from tests.support.data import REPO_ROOT

FOLDER = REPO_ROOT / "datasets" / "opinionqa"


def _script() -> ModuleType:
    path = REPO_ROOT / "scripts" / "opinionqa_scale_order.py"
    spec = importlib.util.spec_from_file_location("opinionqa_scale_order", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _codebook(folder: Path = FOLDER) -> dict[str, list[str]]:
    lines = (folder / "codebook.jsonl").read_text(encoding="utf-8").splitlines()
    return {e["id"]: list(e["options"].values()) for e in map(json.loads, lines) if e}


def test_known_items_are_in_scale_order() -> None:
    cb = _codebook()
    assert cb["SATLIFEc_W50"] == [
        "Very satisfied",
        "Somewhat satisfied",
        "Somewhat dissatisfied",
        "Very dissatisfied",
    ]
    assert cb["F_INCOME"][0] == "Less than $10,000" and cb["F_INCOME"][-1] == "$150,000 or more"
    assert cb["F_IDEO"] == [
        "Very liberal",
        "Liberal",
        "Moderate",
        "Conservative",
        "Very conservative",
    ]
    assert cb["F_EDUCCAT2"][0] == "Less than high school" and cb["F_EDUCCAT2"][-1] == "Postgraduate"
    assert not any("Refused" in label for labels in cb.values() for label in labels)
    protestant = [x for x in cb["F_RELIG"] if x.startswith("Protestant")]
    assert protestant and protestant[0].endswith("Reformed, Church of Christ, etc.)")
    # scales that were already in order keep it
    assert cb["ELECT_IMPT3_PRVFR_W92"][0] == "Not at all important"


def test_the_script_is_deterministic_and_the_shipped_files_are_its_output() -> None:
    script = _script()
    codebook = [
        json.loads(x) for x in (FOLDER / "codebook.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    with (FOLDER / "responses.csv").open(encoding="utf-8", newline="") as fh:
        rows = list(csv.reader(fh))
    new_codebook, new_rows = script.recode(codebook, rows)
    assert new_codebook == codebook and new_rows == rows


def test_recode_maps_answers_by_label_and_drops_missing_options() -> None:
    script = _script()
    codebook = [
        {
            "id": "SATLIFEc_W50",
            "question": "q",
            "options": {
                "A": "Somewhat dissatisfied",
                "B": "Somewhat satisfied",
                "C": "Very dissatisfied",
                "D": "Very satisfied",
            },
        },
        {
            "id": "F_EDUCCAT2",
            "question": "education",
            "options": {
                "A": "Associate's degree",
                "B": "College graduate/some post grad",
                "C": "Don't know/Refused",
                "D": "High school graduate",
                "E": "Less than high school",
                "F": "Postgraduate",
                "G": "Some college, no degree",
            },
        },
    ]
    rows = [["id", "SATLIFEc_W50", "F_EDUCCAT2"], ["1", "D", "C"], ["2", "A", "E"], ["3", "", "G"]]
    new_codebook, new_rows = script.recode(codebook, rows)
    assert new_codebook[0]["options"]["A"] == "Very satisfied"
    assert "Don't know/Refused" not in new_codebook[1]["options"].values()
    # "Very satisfied" -> A; "Don't know/Refused" -> missing; "Somewhat dissatisfied" -> C;
    # "Less than high school" -> A; "Some college, no degree" -> C
    assert new_rows[1:] == [["1", "A", ""], ["2", "C", "A"], ["3", "", "C"]]
