"""Put the shipped OpinionQA codebook's answer options in scale order and recode
``responses.csv`` to match (deterministic; running it again changes nothing).

The source codebook lists each item's options alphabetically ("Somewhat dissatisfied,
Somewhat satisfied, Very dissatisfied, Very satisfied"), while ``datasets/README.md``
promises scale order. For each item in :data:`SCALE_ORDER` the options are re-lettered
``A, B, ...`` in the listed order and every cell of ``responses.csv`` is rewritten from the
old letter to the new one (matched by label, so nothing but the letters changes). Options
in :data:`MISSING` are not answers: they leave the codebook and their cells become empty
(missing). :data:`LABELS` restores labels the source cut off. Items not listed (nominal
ones such as region or race, and scales that are already in order) are left as they are.

Usage::

    python scripts/opinionqa_scale_order.py [datasets/opinionqa]
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from pathlib import Path

SCALE_ORDER: dict[str, list[str]] = {
    "F_EDUCCAT2": [
        "Less than high school",
        "High school graduate",
        "Some college, no degree",
        "Associate's degree",
        "College graduate/some post grad",
        "Postgraduate",
    ],
    "F_IDEO": ["Very liberal", "Liberal", "Moderate", "Conservative", "Very conservative"],
    "F_INCOME": [
        "Less than $10,000",
        "$10,000 to less than $20,000",
        "$20,000 to less than $30,000",
        "$30,000 to less than $40,000",
        "$40,000 to less than $50,000",
        "$50,000 to less than $75,000",
        "$75,000 to less than $100,000",
        "$100,000 to less than $150,000",
        "$150,000 or more",
    ],
    "SATLIFEc_W50": [
        "Very satisfied",
        "Somewhat satisfied",
        "Somewhat dissatisfied",
        "Very dissatisfied",
    ],
    "FAMSURV1_W50": [
        "Working full-time for pay",
        "Working part-time for pay",
        "Not working for pay at all",
    ],
    "FAMSURV6_W50": ["Strongly favor", "Somewhat favor", "Somewhat oppose", "Strongly oppose"],
    "FIN_SIT_W54": [
        "Live comfortably",
        "Meet your basic expenses with a little left over for extras",
        "Just meet your basic expenses",
        "Don\u2019t even have enough to meet basic expenses",
    ],
    "ECON4_a_W54": ["A great deal", "A fair amount", "Not too much", "Not at all"],
    "ECON4_b_W54": ["A great deal", "A fair amount", "Not too much", "Not at all"],
    "INEQ1_W54": [
        "Too much economic inequality",
        "About the right amount of economic inequality",
        "Too little economic inequality",
    ],
    "USEXCEPT_W92": [
        "The U.S. stands above all other countries in the world",
        "The U.S. is one of the greatest countries in the world, along with some others",
        "There are other countries that are better than the U.S.",
    ],
    "WHADVANT_W92": ["A great deal", "A fair amount", "Not too much", "Not at all"],
    "BILLION_W92": [
        "A good thing for the country",
        "Neither a good thing or a bad thing",
        "A bad thing for the country",
    ],
    "FREECOLL_W92": ["Strongly favor", "Somewhat favor", "Somewhat oppose", "Strongly oppose"],
    "PROG_RNEED_W92": ["A lot", "A little", "Nothing at all"],
    "SOCIETY_TRANS_W92": [
        "Very good for society",
        "Somewhat good for society",
        "Neither good nor bad for society",
        "Somewhat bad for society",
        "Very bad for society",
    ],
    "RACESURV52MOD_W92": ["A lot", "Some", "Not much", "Not at all"],
    "UNIMMIGCOMM_W92": ["A lot better", "A little better", "A little worse", "A lot worse"],
    "GODMORALIMP_W92": [
        "Essential",
        "Important, but not essential",
        "Not too important",
        "Not at all important",
    ],
}
"""Item id -> its option labels in scale order (every label but those in MISSING)."""

MISSING: dict[str, set[str]] = {"F_EDUCCAT2": {"Don't know/Refused"}}
"""Options that are not answers: removed, their cells left empty."""

_PROTESTANT = (
    "Protestant (for example, Baptist, Methodist, Non-denominational, Lutheran, "
    "Presbyterian, Pentecostal, Episcopalian, Refo"
)
LABELS: dict[tuple[str, str], str] = {
    ("F_RELIG", _PROTESTANT): (
        "Protestant (for example, Baptist, Methodist, Non-denominational, Lutheran, "
        "Presbyterian, Pentecostal, Episcopalian, Reformed, Church of Christ, etc.)"
    ),
}
"""(item id, label cut off in the source) -> the full label of the Pew questionnaire."""

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def recode(codebook: list[dict], rows: list[list[str]]) -> tuple[list[dict], list[list[str]]]:
    """The codebook in scale order and the response rows recoded to its letters.

    Raises:
        ValueError: an item's labels are not those of :data:`SCALE_ORDER` (plus any of
            :data:`MISSING`; the source changed: update the tables), or a cell holds a
            letter the codebook does not define.
    """
    header = rows[0]
    new_rows = [list(r) for r in rows]
    out = []
    for entry in codebook:
        qid = entry["id"]
        options = {
            letter: LABELS.get((qid, label), label) for letter, label in entry["options"].items()
        }
        order = SCALE_ORDER.get(qid)
        if order is None:
            out.append({**entry, "options": options})
            continue
        missing = MISSING.get(qid, set())
        by_label = {label: letter for letter, label in options.items()}
        if set(by_label) - missing != set(order) or len(by_label) != len(options):
            raise ValueError(f"{qid}: options {sorted(by_label)} do not match the scale table")
        new_letter = {by_label[label]: LETTERS[k] for k, label in enumerate(order)}
        for label in missing & set(by_label):
            new_letter[by_label[label]] = ""
        col = header.index(qid)
        for r in new_rows[1:]:
            cell = r[col]
            if cell == "":
                continue
            if cell not in new_letter:
                raise ValueError(f"{qid}: unknown letter {cell!r} in responses.csv")
            r[col] = new_letter[cell]
        out.append({**entry, "options": {LETTERS[k]: label for k, label in enumerate(order)}})
    return out, new_rows


def main(folder: Path) -> None:
    codebook_path, responses_path = folder / "codebook.jsonl", folder / "responses.csv"
    text = codebook_path.read_text(encoding="utf-8")
    codebook = [json.loads(line) for line in text.splitlines() if line.strip()]
    with responses_path.open(encoding="utf-8", newline="") as fh:
        rows = list(csv.reader(fh))
    new_codebook, new_rows = recode(codebook, rows)
    codebook_path.write_text("".join(json.dumps(e) + "\n" for e in new_codebook), encoding="utf-8")
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(new_rows)
    responses_path.write_text(buf.getvalue(), encoding="utf-8", newline="")
    changed = sum(a != b for a, b in zip(codebook, new_codebook, strict=True))
    print(f"{folder}: {changed} items reordered or relabelled")


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line: the dataset folder, ``datasets/opinionqa`` when omitted."""
    parser = argparse.ArgumentParser(
        prog="scripts/opinionqa_scale_order.py",
        description="Put the OpinionQA codebook's answer options in scale order and recode "
        "responses.csv to match (in place; running it again changes nothing).",
    )
    parser.add_argument(
        "folder",
        nargs="?",
        type=Path,
        default=Path("datasets/opinionqa"),
        help="dataset folder holding codebook.jsonl and responses.csv "
        "(default: datasets/opinionqa)",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    main(parse_args(sys.argv[1:]).folder)
