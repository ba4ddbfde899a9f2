"""The respondent pages' message catalogue (``app/respondent_text.py``): every message in
every language with the same placeholders (and, for ``_html`` messages, the same markup),
the plural rules, the French spacing, and every message id the templates name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app import respondent_text as rt
from app.schemas import StudySettings
from app.session import attribute_question
from app.session.runtime import ItemInfo

TEMPLATES = Path(__file__).resolve().parents[2] / "templates" / "pages"
TAG = re.compile(r"<[^>]*>")


def _forms(texts: str | rt.PluralForms) -> dict[str, str]:
    return dict(texts) if isinstance(texts, dict) else {"text": texts}


def catalogue_problems(messages: dict[str, rt.Texts]) -> list[str]:
    """Every language missing from a message, every text whose placeholders (or, for an
    ``_html`` message, tags) differ from the English one, every plural message without
    exactly the forms ``one`` and ``other``, markup in a plain message."""
    problems = []
    for key, texts in messages.items():
        missing = [lang for lang in rt.LANGUAGES if lang not in texts]
        extra = [lang for lang in texts if lang not in rt.LANGUAGES]
        problems += [f"{key}: no {lang!r} text" for lang in missing]
        problems += [f"{key}: unknown language {lang!r}" for lang in extra]
        if "en" not in texts:
            continue
        english = _forms(texts["en"])
        if isinstance(texts["en"], dict) and set(english) != {"one", "other"}:
            problems.append(f"{key}: plural forms {sorted(english)} (expected one, other)")
        for lang in rt.LANGUAGES:
            if lang not in texts:
                continue
            forms = _forms(texts[lang])
            if set(forms) != set(english):
                problems.append(f"{key} [{lang}]: forms {sorted(forms)}, not {sorted(english)}")
                continue
            for form, template in forms.items():
                where = f"{key} [{lang}, {form}]"
                if rt.placeholders(template) != rt.placeholders(english[form]):
                    problems.append(
                        f"{where}: placeholders {sorted(rt.placeholders(template))}, "
                        f"English has {sorted(rt.placeholders(english[form]))}"
                    )
                if key.endswith("_html"):
                    tags = sorted(TAG.findall(template))
                    if tags != sorted(TAG.findall(english[form])):
                        problems.append(f"{where}: tags {tags} differ from the English ones")
                elif "<" in template:
                    problems.append(f"{where}: markup in a plain text (name it ..._html)")
    return problems


def test_every_message_has_every_language_with_the_same_placeholders() -> None:
    assert catalogue_problems(rt.MESSAGES) == []


def test_the_check_finds_a_missing_language_and_a_changed_placeholder() -> None:
    broken: dict[str, rt.Texts] = {
        "a": {"en": "Question {number}", "de": "Frage {nummer}", "fr": "Question {number}"},
        "b_html": {
            "en": "<strong>{x}</strong>",
            "de": "{x}",
            "fr": "<strong>{x}</strong>",
            "es": "<strong>{x}</strong>",
        },
        "c": {
            "en": {"one": "{count} answer", "other": "{count} answers"},
            "de": "{count} Antworten",
            "fr": {"one": "{count} réponse", "other": "{count} réponses"},
            "es": {"one": "{count} respuesta", "other": "respuestas"},
        },
    }
    assert catalogue_problems(broken) == [
        "a: no 'es' text",
        "a [de, text]: placeholders ['nummer'], English has ['number']",
        "b_html [de, text]: tags [] differ from the English ones",
        "c [de]: forms ['text'], not ['one', 'other']",
        "c [es, other]: placeholders [], English has ['count']",
    ]


def test_the_setting_and_the_catalogue_name_the_same_languages() -> None:
    assert set(rt.LANGUAGE_NAMES) == set(rt.LANGUAGES) == {"en", "de", "fr", "es"}
    assert StudySettings().language == rt.DEFAULT_LANGUAGE == "en"
    assert rt.language_of({"language": "fr"}) == "fr"
    assert rt.language_of({}) == rt.language_of(None) == rt.language_of({"language": "xx"}) == "en"


def test_every_message_id_of_the_templates_is_in_the_catalogue() -> None:
    named: set[str] = set()
    for path in TEMPLATES.glob("respondent_*.html"):
        named |= set(re.findall(r'"([a-z_]+\.[a-z_.]+)"', path.read_text(encoding="utf-8")))
    assert named and named - set(rt.MESSAGES) == set()


@pytest.mark.parametrize(
    ("language", "count", "expected"),
    [
        ("en", 0, "0 answers to the survey questions"),
        ("en", 1, "1 answer to the survey questions"),
        ("en", 2, "2 answers to the survey questions"),
        ("de", 1, "1 Antwort auf die Fragen der Umfrage"),
        ("de", 0, "0 Antworten auf die Fragen der Umfrage"),
        ("fr", 0, "0 réponse aux questions de l’enquête"),  # French: 0 is singular
        ("fr", 1, "1 réponse aux questions de l’enquête"),
        ("fr", 2, "2 réponses aux questions de l’enquête"),
        ("es", 1, "1 respuesta a las preguntas de la encuesta"),
        ("es", 0, "0 respuestas a las preguntas de la encuesta"),
    ],
)
def test_plurals_follow_each_language(language: str, count: int, expected: str) -> None:
    assert rt.text(language, "count.answered", count=count) == expected


def test_texts_fill_placeholders_and_set_no_break_spaces() -> None:
    assert rt.text("en", "progress.question", number=3, total=10) == "Question 3 of at most 10"
    assert rt.text("es", "progress.questions", first=1, last=3, total=9) == (
        "Preguntas 1 a 3 de 9 como máximo"
    )
    assert rt.text("fr", "page.title", study="Étude", title="merci") == "Étude\u00a0: merci"
    assert rt.text("fr", "question.saved_hint", button="Suivant") == (
        "Une réponse est enregistrée dès que vous appuyez sur «\u00a0Suivant\u00a0» et ne peut "
        "plus être modifiée ensuite."
    )
    assert rt.text("de", "progress.percent", percent=40) == "40\u00a0%"
    assert rt.text("en", "progress.percent", percent=40) == "40%"
    # a parameter is put in as it is, even with braces or the signs that get a space
    assert rt.text("fr", "page.title", study="{x} ?", title="a") == "{x} ?\u00a0: a"
    assert rt.listing("de", ["a", "b", "c"]) == "a, b und c"
    assert rt.listing("es", ["a"]) == "a"


def test_the_script_messages_are_complete_in_every_language() -> None:
    english = rt.script_messages("en", several=False)
    assert english["sendError"] == (
        "Your answer could not be sent. Check your connection and press {label} again."
    )
    assert rt.script_messages("en", several=True)["serverError"] == (
        "Something went wrong on our side; your answers were not saved. Please press {label} again."
    )
    for language in rt.LANGUAGES:
        for several in (False, True):
            said = rt.script_messages(language, several=several)
            assert set(said) == set(english)
            for key, template in said.items():
                assert rt.placeholders(template) == rt.placeholders(english[key]), key


def test_attribute_questions_in_each_language() -> None:
    def item(question: str, key: str = "x") -> ItemInfo:
        return ItemInfo(1, key, question, [["A", "x"]], "attribute", None)

    assert attribute_question(item("age")) == "What is your age?"
    assert attribute_question(item("Alter"), "de") == "Bitte geben Sie an: Alter"
    assert attribute_question(item("Âge"), "fr") == "Veuillez indiquer votre âge\u00a0:"
    assert attribute_question(item("", key="estado_civil"), "es") == "¿Cuál es su estado civil?"
    # a question as written stays as written, whatever the language
    assert attribute_question(item("Wie alt sind Sie?"), "de") == "Wie alt sind Sie?"
