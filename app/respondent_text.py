"""The words of the respondent pages (``/s/{slug}``, ``/g/{token}``) in each supported
language: one catalogue, used by the templates (through :mod:`app.templating`), the
routes, the services, :mod:`app.session` and ``static/js/respondent.js`` (whose sentences
the page passes in a ``data-messages`` attribute).

A study's language is its setting ``language`` (:class:`app.schemas.StudySettings`,
default ``"en"``). What the researcher writes (study name, consent text, questions,
options) is shown as written; the admin pages and the JSON API stay English.

:data:`MESSAGES` maps a message id to its text per language. A text has ``{name}``
placeholders (:meth:`str.format`), the same in every language. A text that depends on a
number has one form per plural category (``{"one": ..., "other": ...}``, chosen by
:func:`plural_category` from the parameter ``count``). An id ending in ``_html`` holds
markup (``<strong>``, ``<a href="{url}">``, ``<bdi>``); its parameters are escaped when it
is rendered (:func:`app.templating.make_templates`), every other text is escaped whole.

Example::

    >>> text("de", "progress.question", number=3, total=10)
    'Frage 3 von höchstens 10'
    >>> text("fr", "count.answered", count=0)
    '0 réponse aux questions de l’enquête'

To add a language: add its code to :data:`Language`, its plural rule to
:func:`plural_category`, and its text to every message (``tests/app/test_respondent_text.py``
fails while one is missing or has other placeholders).
"""

from __future__ import annotations

import functools
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

Language = Literal["en", "de", "fr", "es"]
"""The languages of the respondent pages: English, German, French, Spanish."""

LANGUAGES: tuple[Language, ...] = get_args(Language)
DEFAULT_LANGUAGE: Language = "en"

LANGUAGE_NAMES: dict[Language, str] = {
    "en": "English",
    "de": "Deutsch",
    "fr": "Français",
    "es": "Español",
}
"""Each language in its own words (the designer's choice list)."""

NOUNS_CAPITALISED = frozenset({"de"})
"""Languages that write nouns with a capital letter: the bare label of a question about the
respondent keeps its first letter (:func:`app.session.attribute_question`)."""

PluralForms = dict[Literal["one", "other"], str]
Texts = dict[Language, str | PluralForms]

MESSAGES: dict[str, Texts] = {
    # ----- every page ---------------------------------------------------------------------
    "page.survey": {"en": "Survey", "de": "Umfrage", "fr": "Enquête", "es": "Encuesta"},
    "page.title": {
        "en": "{study}: {title}",
        "de": "{study}: {title}",
        "fr": "{study} : {title}",
        "es": "{study}: {title}",
    },
    "page.preview": {
        "en": "Preview — answers are not counted",
        "de": "Vorschau – Antworten werden nicht gezählt",
        "fr": "Aperçu — les réponses ne sont pas comptées",
        "es": "Vista previa: las respuestas no se cuentan",
    },
    "button.continue": {"en": "Continue", "de": "Weiter", "fr": "Continuer", "es": "Continuar"},
    "button.next": {"en": "Next", "de": "Weiter", "fr": "Suivant", "es": "Siguiente"},
    "button.submit_answer": {
        "en": "Submit answer",
        "de": "Antwort senden",
        "fr": "Envoyer la réponse",
        "es": "Enviar respuesta",
    },
    "button.prefer_not": {
        "en": "Prefer not to answer",
        "de": "Keine Angabe",
        "fr": "Je préfère ne pas répondre",
        "es": "Prefiero no responder",
    },
    "button.delete": {
        "en": "Delete my answers",
        "de": "Meine Antworten löschen",
        "fr": "Supprimer mes réponses",
        "es": "Borrar mis respuestas",
    },
    "button.try_again": {
        "en": "Try again",
        "de": "Erneut versuchen",
        "fr": "Réessayer",
        "es": "Volver a intentarlo",
    },
    "progress.question": {
        "en": "Question {number} of at most {total}",
        "de": "Frage {number} von höchstens {total}",
        "fr": "Question {number} sur {total} au maximum",
        "es": "Pregunta {number} de {total} como máximo",
    },
    "progress.questions": {
        "en": "Questions {first} to {last} of at most {total}",
        "de": "Fragen {first} bis {last} von höchstens {total}",
        "fr": "Questions {first} à {last} sur {total} au maximum",
        "es": "Preguntas {first} a {last} de {total} como máximo",
    },
    "progress.percent": {
        "en": "{percent}%",
        "de": "{percent} %",
        "fr": "{percent} %",
        "es": "{percent} %",
    },
    "resume.summary": {
        "en": "Continue later on another device",
        "de": "Später auf einem anderen Gerät fortsetzen",
        "fr": "Continuer plus tard sur un autre appareil",
        "es": "Continuar más tarde en otro dispositivo",
    },
    "resume.keep": {
        "en": "Keep this private link to come back to your answers:",
        "de": "Bewahren Sie diesen privaten Link auf, um zu Ihren Antworten zurückzukehren:",
        "fr": "Gardez ce lien privé pour revenir à vos réponses :",
        "es": "Guarde este enlace privado para volver a sus respuestas:",
    },
    "message.details": {
        "en": "Details: {detail}",
        "de": "Einzelheiten: {detail}",
        "fr": "Détails : {detail}",
        "es": "Detalles: {detail}",
    },
    # ----- consent ------------------------------------------------------------------------
    "consent.title": {
        "en": "information and consent",
        "de": "Information und Einwilligung",
        "fr": "information et consentement",
        "es": "información y consentimiento",
    },
    "consent.heading": {
        "en": "Before you start",
        "de": "Bevor Sie beginnen",
        "fr": "Avant de commencer",
        "es": "Antes de empezar",
    },
    "consent.default_text": {
        "en": "This is a short survey. Your answers are used for research.",
        "de": "Dies ist eine kurze Umfrage. Ihre Antworten werden für die Forschung verwendet.",
        "fr": "Ceci est une courte enquête. Vos réponses sont utilisées pour la recherche.",
        "es": "Esta es una encuesta breve. Sus respuestas se utilizan para investigación.",
    },
    "consent.agree": {
        "en": "I agree, start the survey",
        "de": "Ich stimme zu, Umfrage starten",
        "fr": "J’accepte, commencer l’enquête",
        "es": "Acepto, empezar la encuesta",
    },
    "consent.decline": {
        "en": "I do not want to take part",
        "de": "Ich möchte nicht teilnehmen",
        "fr": "Je ne souhaite pas participer",
        "es": "No deseo participar",
    },
    "consent.lost_html": {
        "en": "<strong>This browser no longer has your answers to this survey</strong> (its cookies were cleared or have expired), so it cannot continue where you were.",
        "de": "<strong>Dieser Browser hat Ihre Antworten auf diese Umfrage nicht mehr</strong> (seine Cookies wurden gelöscht oder sind abgelaufen) und kann daher nicht dort weitermachen, wo Sie aufgehört haben.",
        "fr": "<strong>Ce navigateur n’a plus vos réponses à cette enquête</strong> (ses cookies ont été effacés ou ont expiré) : il ne peut donc pas reprendre là où vous en étiez.",
        "es": "<strong>Este navegador ya no tiene sus respuestas a esta encuesta</strong> (sus cookies se borraron o caducaron), así que no puede continuar donde usted lo dejó.",
    },
    "consent.lost_resume": {
        "en": "If you kept your private resume link (“Continue later on another device”), open it to carry on with your answers. Otherwise you can start again below.",
        "de": "Wenn Sie Ihren privaten Link zum Fortsetzen aufbewahrt haben („Später auf einem anderen Gerät fortsetzen“), öffnen Sie ihn, um mit Ihren Antworten weiterzumachen. Andernfalls können Sie unten neu beginnen.",
        "fr": "Si vous avez gardé votre lien privé de reprise (« Continuer plus tard sur un autre appareil »), ouvrez-le pour reprendre avec vos réponses. Sinon, vous pouvez recommencer ci-dessous.",
        "es": "Si guardó su enlace privado para continuar («Continuar más tarde en otro dispositivo»), ábralo para seguir con sus respuestas. Si no, puede empezar de nuevo aquí abajo.",
    },
    # ----- questions about the respondent -------------------------------------------------
    "about.title": {
        "en": "about you ({page} of {pages})",
        "de": "Angaben zu Ihrer Person ({page} von {pages})",
        "fr": "à propos de vous ({page} sur {pages})",
        "es": "sobre usted ({page} de {pages})",
    },
    "about.heading": {
        "en": "A few questions about you",
        "de": "Einige Fragen zu Ihrer Person",
        "fr": "Quelques questions sur vous",
        "es": "Algunas preguntas sobre usted",
    },
    "about.question": {
        "en": "What is your {label}?",
        "de": "Bitte geben Sie an: {label}",
        "fr": "Veuillez indiquer votre {label} :",
        "es": "¿Cuál es su {label}?",
    },
    "about.skip_prompt_html": {
        "en": "<strong>You did not choose an answer on this page.</strong> Skip all the remaining questions about you?",
        "de": "<strong>Sie haben auf dieser Seite keine Antwort ausgewählt.</strong> Alle übrigen Fragen zu Ihrer Person überspringen?",
        "fr": "<strong>Vous n’avez choisi aucune réponse sur cette page.</strong> Passer toutes les questions restantes vous concernant ?",
        "es": "<strong>No ha elegido ninguna respuesta en esta página.</strong> ¿Desea omitir todas las preguntas restantes sobre usted?",
    },
    "about.skip_all": {
        "en": "Yes, skip the questions about me",
        "de": "Ja, die Fragen zu meiner Person überspringen",
        "fr": "Oui, passer les questions me concernant",
        "es": "Sí, omitir las preguntas sobre mí",
    },
    "about.or_choose": {
        "en": "Or choose your answers below and press “Continue”.",
        "de": "Oder wählen Sie unten Ihre Antworten aus und klicken Sie auf „Weiter“.",
        "fr": "Ou choisissez vos réponses ci-dessous et appuyez sur « Continuer ».",
        "es": "O elija sus respuestas a continuación y pulse «Continuar».",
    },
    "about.blank_html": {
        "en": {
            "one": "<strong>You did not answer {count} question on this page.</strong> Answer it, or press “Continue” to leave it unanswered.",
            "other": "<strong>You did not answer {count} questions on this page.</strong> Answer them, or press “Continue” to leave them unanswered.",
        },
        "de": {
            "one": "<strong>Sie haben {count} Frage auf dieser Seite nicht beantwortet.</strong> Beantworten Sie sie, oder klicken Sie auf „Weiter“, um sie unbeantwortet zu lassen.",
            "other": "<strong>Sie haben {count} Fragen auf dieser Seite nicht beantwortet.</strong> Beantworten Sie sie, oder klicken Sie auf „Weiter“, um sie unbeantwortet zu lassen.",
        },
        "fr": {
            "one": "<strong>Vous n’avez pas répondu à {count} question sur cette page.</strong> Répondez-y, ou appuyez sur « Continuer » pour la laisser sans réponse.",
            "other": "<strong>Vous n’avez pas répondu à {count} questions sur cette page.</strong> Répondez-y, ou appuyez sur « Continuer » pour les laisser sans réponse.",
        },
        "es": {
            "one": "<strong>No ha respondido {count} pregunta de esta página.</strong> Respóndala o pulse «Continuar» para dejarla sin respuesta.",
            "other": "<strong>No ha respondido {count} preguntas de esta página.</strong> Respóndalas o pulse «Continuar» para dejarlas sin respuesta.",
        },
    },
    "about.not_answered": {
        "en": "Not answered yet",
        "de": "Noch nicht beantwortet",
        "fr": "Pas encore de réponse",
        "es": "Todavía sin responder",
    },
    "about.answer_every": {
        "en": "Please answer every question.",
        "de": "Bitte beantworten Sie alle Fragen.",
        "fr": "Veuillez répondre à toutes les questions.",
        "es": "Por favor, responda a todas las preguntas.",
    },
    "about.unreadable": {
        "en": "Nothing was saved: the answers on this page could not be read. Please choose them again.",
        "de": "Es wurde nichts gespeichert: Die Antworten auf dieser Seite konnten nicht gelesen werden. Bitte wählen Sie sie erneut aus.",
        "fr": "Rien n’a été enregistré : les réponses de cette page n’ont pas pu être lues. Veuillez les choisir à nouveau.",
        "es": "No se guardó nada: no se pudieron leer las respuestas de esta página. Por favor, elíjalas de nuevo.",
    },
    "about.refused": {
        "en": "{reason}",
        "de": "Ihre Antworten wurden nicht gespeichert. Bitte wählen Sie sie erneut aus (Grund: {reason}).",
        "fr": "Vos réponses n’ont pas été enregistrées. Veuillez les choisir à nouveau (motif : {reason}).",
        "es": "Sus respuestas no se guardaron. Por favor, elíjalas de nuevo (motivo: {reason}).",
    },
    # ----- a question ---------------------------------------------------------------------
    "question.title": {
        "en": "question {number}",
        "de": "Frage {number}",
        "fr": "question {number}",
        "es": "pregunta {number}",
    },
    "question.title_one": {
        "en": "your question",
        "de": "Ihre Frage",
        "fr": "votre question",
        "es": "su pregunta",
    },
    "question.saved_hint": {
        "en": "An answer is saved when you press {button} and cannot be changed afterwards.",
        "de": "Eine Antwort wird gespeichert, sobald Sie auf „{button}“ klicken, und kann danach nicht mehr geändert werden.",
        "fr": "Une réponse est enregistrée dès que vous appuyez sur « {button} » et ne peut plus être modifiée ensuite.",
        "es": "Una respuesta se guarda al pulsar «{button}» y ya no se puede cambiar después.",
    },
    "question.choose": {
        "en": "Please choose an answer.",
        "de": "Bitte wählen Sie eine Antwort aus.",
        "fr": "Veuillez choisir une réponse.",
        "es": "Por favor, elija una respuesta.",
    },
    "question.choose_or_skip": {
        "en": "Please choose an answer or press “Prefer not to answer”.",
        "de": "Bitte wählen Sie eine Antwort aus oder klicken Sie auf „Keine Angabe“.",
        "fr": "Veuillez choisir une réponse ou appuyer sur « Je préfère ne pas répondre ».",
        "es": "Por favor, elija una respuesta o pulse «Prefiero no responder».",
    },
    "question.already_answered": {
        "en": "That question was already answered (perhaps in another tab). Here is where you are now.",
        "de": "Diese Frage wurde bereits beantwortet (vielleicht in einem anderen Tab). Hier ist Ihr aktueller Stand.",
        "fr": "Cette question a déjà reçu une réponse (peut-être dans un autre onglet). Voici où vous en êtes.",
        "es": "Esa pregunta ya se respondió (quizá en otra pestaña). Aquí es donde se encuentra ahora.",
    },
    "question.unreadable": {
        "en": "Nothing was saved: your answer could not be read. Please choose your answer again.",
        "de": "Es wurde nichts gespeichert: Ihre Antwort konnte nicht gelesen werden. Bitte wählen Sie Ihre Antwort erneut aus.",
        "fr": "Rien n’a été enregistré : votre réponse n’a pas pu être lue. Veuillez choisir à nouveau votre réponse.",
        "es": "No se guardó nada: no se pudo leer su respuesta. Por favor, elija su respuesta de nuevo.",
    },
    "question.refused": {
        "en": "{reason}",
        "de": "Ihre Antwort wurde nicht gespeichert. Bitte wählen Sie sie erneut aus (Grund: {reason}).",
        "fr": "Votre réponse n’a pas été enregistrée. Veuillez la choisir à nouveau (motif : {reason}).",
        "es": "Su respuesta no se guardó. Por favor, elíjala de nuevo (motivo: {reason}).",
    },
    # ----- while an answer is sent (static/js/respondent.js) ------------------------------
    "js.saving": {
        "en": "Saving…",
        "de": "Wird gespeichert…",
        "fr": "Enregistrement…",
        "es": "Guardando…",
    },
    "js.send_error.answer": {
        "en": "Your answer could not be sent. Check your connection and press {label} again.",
        "de": "Ihre Antwort konnte nicht gesendet werden. Prüfen Sie Ihre Verbindung und klicken Sie erneut auf „{label}“.",
        "fr": "Votre réponse n’a pas pu être envoyée. Vérifiez votre connexion et appuyez à nouveau sur « {label} ».",
        "es": "No se pudo enviar su respuesta. Compruebe su conexión y vuelva a pulsar «{label}».",
    },
    "js.send_error.answers": {
        "en": "Your answers could not be sent. Check your connection and press {label} again.",
        "de": "Ihre Antworten konnten nicht gesendet werden. Prüfen Sie Ihre Verbindung und klicken Sie erneut auf „{label}“.",
        "fr": "Vos réponses n’ont pas pu être envoyées. Vérifiez votre connexion et appuyez à nouveau sur « {label} ».",
        "es": "No se pudieron enviar sus respuestas. Compruebe su conexión y vuelva a pulsar «{label}».",
    },
    "js.busy": {
        "en": "Too many answers from your network just now: please wait {seconds} and press {label} again.",
        "de": "Gerade kommen zu viele Antworten aus Ihrem Netzwerk: Bitte warten Sie {seconds} und klicken Sie dann erneut auf „{label}“.",
        "fr": "Trop de réponses viennent de votre réseau en ce moment : veuillez patienter {seconds} puis appuyer à nouveau sur « {label} ».",
        "es": "Hay demasiadas respuestas desde su red en este momento: espere {seconds} y vuelva a pulsar «{label}».",
    },
    "js.seconds": {
        "en": {"one": "a second", "other": "{count} seconds"},
        "de": {"one": "eine Sekunde", "other": "{count} Sekunden"},
        "fr": {"one": "une seconde", "other": "{count} secondes"},
        "es": {"one": "un segundo", "other": "{count} segundos"},
    },
    "js.seconds_unknown": {
        "en": "a few seconds",
        "de": "einige Sekunden",
        "fr": "quelques secondes",
        "es": "unos segundos",
    },
    "js.server_error.answer": {
        "en": "Something went wrong on our side; your answer was not saved. Please press {label} again.",
        "de": "Bei uns ist ein Fehler aufgetreten; Ihre Antwort wurde nicht gespeichert. Bitte klicken Sie erneut auf „{label}“.",
        "fr": "Un problème est survenu de notre côté ; votre réponse n’a pas été enregistrée. Veuillez appuyer à nouveau sur « {label} ».",
        "es": "Algo ha fallado por nuestra parte; su respuesta no se guardó. Por favor, vuelva a pulsar «{label}».",
    },
    "js.server_error.answers": {
        "en": "Something went wrong on our side; your answers were not saved. Please press {label} again.",
        "de": "Bei uns ist ein Fehler aufgetreten; Ihre Antworten wurden nicht gespeichert. Bitte klicken Sie erneut auf „{label}“.",
        "fr": "Un problème est survenu de notre côté ; vos réponses n’ont pas été enregistrées. Veuillez appuyer à nouveau sur « {label} ».",
        "es": "Algo ha fallado por nuestra parte; sus respuestas no se guardaron. Por favor, vuelva a pulsar «{label}».",
    },
    "js.other_error.answer": {
        "en": "Your answer was not saved (error {status}). Please reload the page and try again.",
        "de": "Ihre Antwort wurde nicht gespeichert (Fehler {status}). Bitte laden Sie die Seite neu und versuchen Sie es noch einmal.",
        "fr": "Votre réponse n’a pas été enregistrée (erreur {status}). Veuillez recharger la page et réessayer.",
        "es": "Su respuesta no se guardó (error {status}). Por favor, recargue la página e inténtelo de nuevo.",
    },
    "js.other_error.answers": {
        "en": "Your answers were not saved (error {status}). Please reload the page and try again.",
        "de": "Ihre Antworten wurden nicht gespeichert (Fehler {status}). Bitte laden Sie die Seite neu und versuchen Sie es noch einmal.",
        "fr": "Vos réponses n’ont pas été enregistrées (erreur {status}). Veuillez recharger la page et réessayer.",
        "es": "Sus respuestas no se guardaron (error {status}). Por favor, recargue la página e inténtelo de nuevo.",
    },
    # ----- completion ---------------------------------------------------------------------
    "done.title": {"en": "thank you", "de": "vielen Dank", "fr": "merci", "es": "gracias"},
    "done.heading": {"en": "Thank you!", "de": "Vielen Dank!", "fr": "Merci !", "es": "¡Gracias!"},
    "done.saved": {
        "en": "Your answers were saved.",
        "de": "Ihre Antworten wurden gespeichert.",
        "fr": "Vos réponses ont été enregistrées.",
        "es": "Sus respuestas se han guardado.",
    },
    "done.code": {
        "en": "Your completion code:",
        "de": "Ihr Abschlusscode:",
        "fr": "Votre code de fin d’enquête :",
        "es": "Su código de finalización:",
    },
    "done.close": {
        "en": "You can close this page now.",
        "de": "Sie können diese Seite jetzt schließen.",
        "fr": "Vous pouvez maintenant fermer cette page.",
        "es": "Ya puede cerrar esta página.",
    },
    "done.delete_browser_html": {
        "en": 'You can <a href="{url}">have your answers deleted</a> later from this browser; elsewhere, please ask the research team.',
        "de": 'Sie können Ihre Antworten später in diesem Browser <a href="{url}">löschen lassen</a>; von einem anderen Gerät aus wenden Sie sich bitte an das Forschungsteam.',
        "fr": 'Vous pourrez <a href="{url}">faire supprimer vos réponses</a> plus tard depuis ce navigateur ; ailleurs, veuillez vous adresser à l’équipe de recherche.',
        "es": 'Más adelante podrá <a href="{url}">pedir que se borren sus respuestas</a> desde este navegador; desde otro lugar, diríjase al equipo de investigación.',
    },
    "done.delete_code_html": {
        "en": 'Keep your completion code: with it you can <a href="{url}">have your answers deleted</a> later.',
        "de": 'Bewahren Sie Ihren Abschlusscode auf: Damit können Sie Ihre Antworten später <a href="{url}">löschen lassen</a>.',
        "fr": 'Conservez votre code de fin d’enquête : il vous permettra de <a href="{url}">faire supprimer vos réponses</a> plus tard.',
        "es": 'Guarde su código de finalización: con él podrá <a href="{url}">pedir que se borren sus respuestas</a> más adelante.',
    },
    "learned.heading": {
        "en": "What we learned about you",
        "de": "Was wir über Sie erfahren haben",
        "fr": "Ce que nous avons appris sur vous",
        "es": "Lo que hemos aprendido sobre usted",
    },
    "learned.intro": {
        "en": "From your answers, our model guesses how you would answer questions you were not asked. These are guesses, not facts about you.",
        "de": "Aus Ihren Antworten schätzt unser Modell, wie Sie Fragen beantworten würden, die Ihnen nicht gestellt wurden. Das sind Vermutungen, keine Tatsachen über Sie.",
        "fr": "À partir de vos réponses, notre modèle devine comment vous répondriez aux questions qui ne vous ont pas été posées. Ce sont des suppositions, pas des faits vous concernant.",
        "es": "A partir de sus respuestas, nuestro modelo estima cómo respondería a las preguntas que no se le hicieron. Son suposiciones, no hechos sobre usted.",
    },
    "learned.guess_html": {
        "en": "We think you would answer “<bdi>{answer}</bdi>” to “<bdi>{question}</bdi>” ({percent}% sure).",
        "de": "Wir vermuten, dass Sie „<bdi>{question}</bdi>“ mit „<bdi>{answer}</bdi>“ beantworten würden (zu {percent} % sicher).",
        "fr": "Nous pensons que vous répondriez « <bdi>{answer}</bdi> » à « <bdi>{question}</bdi> » (certitude : {percent} %).",
        "es": "Creemos que respondería «<bdi>{answer}</bdi>» a «<bdi>{question}</bdi>» (con un {percent} % de seguridad).",
    },
    "learned.matters": {
        "en": "What matters to you",
        "de": "Was Ihnen wichtig ist",
        "fr": "Ce qui compte pour vous",
        "es": "Lo que le importa",
    },
    # ----- declining and deleting ---------------------------------------------------------
    "declined.title": {
        "en": "your answers",
        "de": "Ihre Antworten",
        "fr": "vos réponses",
        "es": "sus respuestas",
    },
    "declined.heading": {
        "en": "You chose not to take part",
        "de": "Sie haben sich gegen eine Teilnahme entschieden",
        "fr": "Vous avez choisi de ne pas participer",
        "es": "Ha decidido no participar",
    },
    "declined.nothing": {
        "en": "No problem. Nothing was recorded. You can close this page.",
        "de": "Kein Problem. Es wurde nichts gespeichert. Sie können diese Seite schließen.",
        "fr": "Aucun problème. Rien n’a été enregistré. Vous pouvez fermer cette page.",
        "es": "No hay problema. No se ha registrado nada. Puede cerrar esta página.",
    },
    "declined.stored": {
        "en": "This browser had already started this survey, so some answers are stored:",
        "de": "In diesem Browser wurde diese Umfrage bereits begonnen, daher sind einige Antworten gespeichert:",
        "fr": "Ce navigateur avait déjà commencé cette enquête, si bien que certaines réponses sont enregistrées :",
        "es": "Este navegador ya había empezado esta encuesta, así que hay algunas respuestas guardadas:",
    },
    "declined.stored_finished": {
        "en": "This browser had already started this survey and finished it, so some answers are stored:",
        "de": "In diesem Browser wurde diese Umfrage bereits begonnen und abgeschlossen, daher sind einige Antworten gespeichert:",
        "fr": "Ce navigateur avait déjà commencé et terminé cette enquête, si bien que certaines réponses sont enregistrées :",
        "es": "Este navegador ya había empezado y terminado esta encuesta, así que hay algunas respuestas guardadas:",
    },
    "declined.can_delete": {
        "en": "You can delete all of it now: nothing of it is kept, only a count that one respondent asked for deletion. If you changed your mind, you can also go on where you were.",
        "de": "Sie können jetzt alles löschen: Davon wird nichts aufbewahrt, nur eine Zählung, dass eine teilnehmende Person um Löschung gebeten hat. Wenn Sie es sich anders überlegt haben, können Sie auch dort weitermachen, wo Sie aufgehört haben.",
        "fr": "Vous pouvez tout supprimer maintenant : rien n’en est conservé, seulement le décompte d’une personne ayant demandé la suppression. Si vous avez changé d’avis, vous pouvez aussi reprendre là où vous en étiez.",
        "es": "Puede borrarlo todo ahora: no se conserva nada, solo el recuento de que una persona participante pidió el borrado. Si ha cambiado de opinión, también puede continuar donde lo dejó.",
    },
    "declined.show_code": {
        "en": "Show my completion code",
        "de": "Meinen Abschlusscode anzeigen",
        "fr": "Afficher mon code de fin d’enquête",
        "es": "Mostrar mi código de finalización",
    },
    "declined.continue": {
        "en": "Continue the survey",
        "de": "Umfrage fortsetzen",
        "fr": "Continuer l’enquête",
        "es": "Continuar la encuesta",
    },
    "count.answered": {
        "en": {
            "one": "{count} answer to the survey questions",
            "other": "{count} answers to the survey questions",
        },
        "de": {
            "one": "{count} Antwort auf die Fragen der Umfrage",
            "other": "{count} Antworten auf die Fragen der Umfrage",
        },
        "fr": {
            "one": "{count} réponse aux questions de l’enquête",
            "other": "{count} réponses aux questions de l’enquête",
        },
        "es": {
            "one": "{count} respuesta a las preguntas de la encuesta",
            "other": "{count} respuestas a las preguntas de la encuesta",
        },
    },
    "count.skipped": {
        "en": {
            "one": "{count} question you preferred not to answer",
            "other": "{count} questions you preferred not to answer",
        },
        "de": {
            "one": "{count} Frage, die Sie nicht beantworten wollten",
            "other": "{count} Fragen, die Sie nicht beantworten wollten",
        },
        "fr": {
            "one": "{count} question à laquelle vous avez préféré ne pas répondre",
            "other": "{count} questions auxquelles vous avez préféré ne pas répondre",
        },
        "es": {
            "one": "{count} pregunta que prefirió no responder",
            "other": "{count} preguntas que prefirió no responder",
        },
    },
    "count.attributes": {
        "en": {
            "one": "{count} answer to the questions about you",
            "other": "{count} answers to the questions about you",
        },
        "de": {
            "one": "{count} Antwort auf die Fragen zu Ihrer Person",
            "other": "{count} Antworten auf die Fragen zu Ihrer Person",
        },
        "fr": {
            "one": "{count} réponse aux questions vous concernant",
            "other": "{count} réponses aux questions vous concernant",
        },
        "es": {
            "one": "{count} respuesta a las preguntas sobre usted",
            "other": "{count} respuestas a las preguntas sobre usted",
        },
    },
    "list.and": {
        "en": "{rest} and {last}",
        "de": "{rest} und {last}",
        "fr": "{rest} et {last}",
        "es": "{rest} y {last}",
    },
    "delete.title": {
        "en": "delete my answers",
        "de": "meine Antworten löschen",
        "fr": "supprimer mes réponses",
        "es": "borrar mis respuestas",
    },
    "delete.intro": {
        "en": "You can have everything you answered in this survey deleted. This cannot be undone: afterwards nothing of it is kept, only a count that one respondent asked for deletion.",
        "de": "Sie können alles löschen lassen, was Sie in dieser Umfrage geantwortet haben. Das lässt sich nicht rückgängig machen: Danach wird nichts davon aufbewahrt, nur eine Zählung, dass eine teilnehmende Person um Löschung gebeten hat.",
        "fr": "Vous pouvez faire supprimer tout ce que vous avez répondu dans cette enquête. C’est irréversible : ensuite, rien n’en est conservé, seulement le décompte d’une personne ayant demandé la suppression.",
        "es": "Puede pedir que se borre todo lo que respondió en esta encuesta. No se puede deshacer: después no se conserva nada, solo el recuento de que una persona participante pidió el borrado.",
    },
    "delete.shared_code": {
        "en": "This survey gives everyone the same completion code, so the code cannot find your answers. They can be deleted from the browser you took part in: open this page there.",
        "de": "Diese Umfrage gibt allen denselben Abschlusscode, daher kann der Code Ihre Antworten nicht finden. Sie lassen sich in dem Browser löschen, mit dem Sie teilgenommen haben: Öffnen Sie diese Seite dort.",
        "fr": "Cette enquête donne le même code de fin d’enquête à tout le monde : ce code ne permet donc pas de retrouver vos réponses. Elles peuvent être supprimées depuis le navigateur avec lequel vous avez participé : ouvrez cette page dans ce navigateur.",
        "es": "Esta encuesta da a todas las personas el mismo código de finalización, así que el código no permite encontrar sus respuestas. Pueden borrarse desde el navegador con el que participó: abra esta página allí.",
    },
    "delete.shared_resume": {
        "en": "If you kept the private link shown during the survey (under “Continue later on another device”), open it in this browser; this page then offers to delete your answers here.",
        "de": "Wenn Sie den privaten Link aufbewahrt haben, der während der Umfrage angezeigt wurde (unter „Später auf einem anderen Gerät fortsetzen“), öffnen Sie ihn in diesem Browser; diese Seite bietet Ihnen dann an, Ihre Antworten hier zu löschen.",
        "fr": "Si vous avez gardé le lien privé affiché pendant l’enquête (sous « Continuer plus tard sur un autre appareil »), ouvrez-le dans ce navigateur ; cette page vous proposera alors de supprimer vos réponses ici.",
        "es": "Si guardó el enlace privado que se mostró durante la encuesta (en «Continuar más tarde en otro dispositivo»), ábralo en este navegador; esta página le ofrecerá entonces borrar sus respuestas aquí.",
    },
    "delete.shared_contact": {
        "en": "Otherwise, please contact the research team (their contact is in the information you were given before the survey).",
        "de": "Andernfalls wenden Sie sich bitte an das Forschungsteam (die Kontaktdaten finden Sie in den Informationen, die Sie vor der Umfrage erhalten haben).",
        "fr": "Sinon, veuillez contacter l’équipe de recherche (ses coordonnées figurent dans les informations qui vous ont été données avant l’enquête).",
        "es": "De lo contrario, póngase en contacto con el equipo de investigación (sus datos de contacto figuran en la información que recibió antes de la encuesta).",
    },
    "delete.this_browser": {
        "en": "This browser took part in the survey: you can delete those answers directly.",
        "de": "Mit diesem Browser wurde an der Umfrage teilgenommen: Sie können diese Antworten direkt löschen.",
        "fr": "Ce navigateur a participé à l’enquête : vous pouvez supprimer ces réponses directement.",
        "es": "Con este navegador se participó en la encuesta: puede borrar esas respuestas directamente.",
    },
    "delete.code_label": {
        "en": "Your completion code (shown on the last page of the survey)",
        "de": "Ihr Abschlusscode (auf der letzten Seite der Umfrage angezeigt)",
        "fr": "Votre code de fin d’enquête (affiché sur la dernière page de l’enquête)",
        "es": "Su código de finalización (se muestra en la última página de la encuesta)",
    },
    "delete.confirm": {
        "en": "I understand that my answers will be deleted for good.",
        "de": "Mir ist bewusst, dass meine Antworten endgültig gelöscht werden.",
        "fr": "Je comprends que mes réponses seront définitivement supprimées.",
        "es": "Entiendo que mis respuestas se borrarán definitivamente.",
    },
    "delete.error_confirm": {
        "en": "Please tick the box to confirm that your answers should be deleted.",
        "de": "Bitte setzen Sie das Häkchen, um zu bestätigen, dass Ihre Antworten gelöscht werden sollen.",
        "fr": "Veuillez cocher la case pour confirmer que vos réponses doivent être supprimées.",
        "es": "Por favor, marque la casilla para confirmar que sus respuestas deben borrarse.",
    },
    "delete.error_shared_code": {
        "en": "This survey gives everyone the same completion code, so it cannot name your answers. Please open this page in the browser you took part in, or contact the research team.",
        "de": "Diese Umfrage gibt allen denselben Abschlusscode, daher bezeichnet er nicht Ihre Antworten. Bitte öffnen Sie diese Seite in dem Browser, mit dem Sie teilgenommen haben, oder wenden Sie sich an das Forschungsteam.",
        "fr": "Cette enquête donne le même code de fin d’enquête à tout le monde : il ne permet donc pas de désigner vos réponses. Veuillez ouvrir cette page dans le navigateur avec lequel vous avez participé, ou contacter l’équipe de recherche.",
        "es": "Esta encuesta da a todas las personas el mismo código de finalización, así que no identifica sus respuestas. Por favor, abra esta página en el navegador con el que participó o póngase en contacto con el equipo de investigación.",
    },
    "delete.error_code": {
        "en": "No finished survey has this completion code. Please check it: it is the code shown on the last page (10 letters and digits).",
        "de": "Keine abgeschlossene Umfrage hat diesen Abschlusscode. Bitte prüfen Sie ihn: Es ist der Code, der auf der letzten Seite angezeigt wurde (10 Buchstaben und Ziffern).",
        "fr": "Aucune enquête terminée n’a ce code de fin d’enquête. Veuillez le vérifier : c’est le code affiché sur la dernière page (10 lettres et chiffres).",
        "es": "Ninguna encuesta terminada tiene este código de finalización. Por favor, compruébelo: es el código que se mostró en la última página (10 letras y dígitos).",
    },
    "deleted.title": {
        "en": "Your answers were deleted",
        "de": "Ihre Antworten wurden gelöscht",
        "fr": "Vos réponses ont été supprimées",
        "es": "Sus respuestas se han borrado",
    },
    "deleted.listed": {
        "en": "We deleted everything stored about you in this survey: {listed}. Only a count that one respondent asked for deletion is kept. You can close this page.",
        "de": "Wir haben alles gelöscht, was in dieser Umfrage über Sie gespeichert war: {listed}. Aufbewahrt wird nur eine Zählung, dass eine teilnehmende Person um Löschung gebeten hat. Sie können diese Seite schließen.",
        "fr": "Nous avons supprimé tout ce qui était enregistré à votre sujet dans cette enquête : {listed}. Seul le décompte d’une personne ayant demandé la suppression est conservé. Vous pouvez fermer cette page.",
        "es": "Hemos borrado todo lo que estaba guardado sobre usted en esta encuesta: {listed}. Solo se conserva el recuento de que una persona participante pidió el borrado. Puede cerrar esta página.",
    },
    "deleted.nothing_answered": {
        "en": "We deleted everything stored about you in this survey (you had not answered any question yet). Only a count that one respondent asked for deletion is kept. You can close this page.",
        "de": "Wir haben alles gelöscht, was in dieser Umfrage über Sie gespeichert war (Sie hatten noch keine Frage beantwortet). Aufbewahrt wird nur eine Zählung, dass eine teilnehmende Person um Löschung gebeten hat. Sie können diese Seite schließen.",
        "fr": "Nous avons supprimé tout ce qui était enregistré à votre sujet dans cette enquête (vous n’aviez encore répondu à aucune question). Seul le décompte d’une personne ayant demandé la suppression est conservé. Vous pouvez fermer cette page.",
        "es": "Hemos borrado todo lo que estaba guardado sobre usted en esta encuesta (aún no había respondido ninguna pregunta). Solo se conserva el recuento de que una persona participante pidió el borrado. Puede cerrar esta página.",
    },
    "deleted.already": {
        "en": "These answers were already deleted. You can close this page.",
        "de": "Diese Antworten wurden bereits gelöscht. Sie können diese Seite schließen.",
        "fr": "Ces réponses ont déjà été supprimées. Vous pouvez fermer cette page.",
        "es": "Estas respuestas ya se habían borrado. Puede cerrar esta página.",
    },
    # ----- preparing, refusals and notices ------------------------------------------------
    "preparing.title": {
        "en": "preparing the survey",
        "de": "Umfrage wird vorbereitet",
        "fr": "préparation de l’enquête",
        "es": "preparando la encuesta",
    },
    "preparing.heading": {
        "en": "Preparing the survey",
        "de": "Die Umfrage wird vorbereitet",
        "fr": "Préparation de l’enquête",
        "es": "Preparando la encuesta",
    },
    "preparing.text": {
        "en": "This survey is being prepared; this page will update by itself.",
        "de": "Diese Umfrage wird gerade vorbereitet; diese Seite aktualisiert sich von selbst.",
        "fr": "Cette enquête est en cours de préparation ; cette page se mettra à jour d’elle-même.",
        "es": "Esta encuesta se está preparando; esta página se actualizará sola.",
    },
    "preparing.leave_open": {
        "en": "It refreshes by itself when the survey is ready: you can leave it open.",
        "de": "Die Seite lädt sich neu, sobald die Umfrage bereit ist: Sie können sie geöffnet lassen.",
        "fr": "Elle s’actualise d’elle-même dès que l’enquête est prête : vous pouvez la laisser ouverte.",
        "es": "Se actualiza sola cuando la encuesta está lista: puede dejarla abierta.",
    },
    "preparing.check_now": {
        "en": "Check now",
        "de": "Jetzt prüfen",
        "fr": "Vérifier maintenant",
        "es": "Comprobar ahora",
    },
    "not_open.title": {
        "en": "Survey not available",
        "de": "Umfrage nicht verfügbar",
        "fr": "Enquête indisponible",
        "es": "Encuesta no disponible",
    },
    "not_open.text": {
        "en": "This survey does not exist or is not open. Please check the link you were given.",
        "de": "Diese Umfrage gibt es nicht, oder sie ist nicht geöffnet. Bitte prüfen Sie den Link, den Sie erhalten haben.",
        "fr": "Cette enquête n’existe pas ou n’est pas ouverte. Veuillez vérifier le lien qui vous a été donné.",
        "es": "Esta encuesta no existe o no está abierta. Por favor, compruebe el enlace que recibió.",
    },
    "fit_failed.title": {
        "en": "Survey not available yet",
        "de": "Umfrage noch nicht verfügbar",
        "fr": "Enquête pas encore disponible",
        "es": "Encuesta aún no disponible",
    },
    "fit_failed.text": {
        "en": "This survey cannot start yet. Please try again later.",
        "de": "Diese Umfrage kann noch nicht beginnen. Bitte versuchen Sie es später noch einmal.",
        "fr": "Cette enquête ne peut pas encore commencer. Veuillez réessayer plus tard.",
        "es": "Esta encuesta aún no puede empezar. Por favor, inténtelo de nuevo más tarde.",
    },
    "cannot_start.title": {
        "en": "Cannot start the survey",
        "de": "Die Umfrage kann nicht beginnen",
        "fr": "Impossible de commencer l’enquête",
        "es": "No se puede empezar la encuesta",
    },
    "cannot_start.text": {
        "en": "{reason}",
        "de": "Bitte versuchen Sie es später noch einmal (Grund: {reason}).",
        "fr": "Veuillez réessayer plus tard (motif : {reason}).",
        "es": "Por favor, inténtelo de nuevo más tarde (motivo: {reason}).",
    },
    "invalid_link.title": {
        "en": "This link does not work",
        "de": "Dieser Link funktioniert nicht",
        "fr": "Ce lien ne fonctionne pas",
        "es": "Este enlace no funciona",
    },
    "invalid_link.text": {
        "en": "The survey link you opened is incomplete or was changed, so the survey cannot start from it. Please open the link exactly as you received it (copy all of it, or click it again in the invitation), or contact the study team.",
        "de": "Der Umfragelink, den Sie geöffnet haben, ist unvollständig oder wurde verändert, daher kann die Umfrage damit nicht beginnen. Bitte öffnen Sie den Link genau so, wie Sie ihn erhalten haben (kopieren Sie ihn vollständig, oder klicken Sie in der Einladung erneut darauf), oder wenden Sie sich an das Studienteam.",
        "fr": "Le lien d’enquête que vous avez ouvert est incomplet ou a été modifié : l’enquête ne peut donc pas commencer à partir de ce lien. Veuillez ouvrir le lien exactement tel que vous l’avez reçu (copiez-le en entier, ou cliquez à nouveau dessus dans l’invitation), ou contactez l’équipe de l’étude.",
        "es": "El enlace de la encuesta que abrió está incompleto o se modificó, así que la encuesta no puede empezar desde él. Por favor, abra el enlace exactamente como lo recibió (cópielo completo o vuelva a hacer clic en él en la invitación), o póngase en contacto con el equipo del estudio.",
    },
    "link_invalid.title": {
        "en": "Link not valid",
        "de": "Link ungültig",
        "fr": "Lien non valide",
        "es": "Enlace no válido",
    },
    "link_invalid.resume": {
        "en": "This resume link is not valid (the survey may be closed, or your answers were deleted).",
        "de": "Dieser Link zum Fortsetzen ist nicht gültig (die Umfrage ist möglicherweise geschlossen, oder Ihre Antworten wurden gelöscht).",
        "fr": "Ce lien de reprise n’est pas valide (l’enquête est peut-être fermée, ou vos réponses ont été supprimées).",
        "es": "Este enlace para continuar no es válido (puede que la encuesta esté cerrada o que sus respuestas se hayan borrado).",
    },
    "link_invalid.member": {
        "en": "This link is not valid. Please check the link you were given.",
        "de": "Dieser Link ist nicht gültig. Bitte prüfen Sie den Link, den Sie erhalten haben.",
        "fr": "Ce lien n’est pas valide. Veuillez vérifier le lien qui vous a été donné.",
        "es": "Este enlace no es válido. Por favor, compruebe el enlace que recibió.",
    },
    "limit.title": {
        "en": "Please wait a moment",
        "de": "Bitte warten Sie einen Moment",
        "fr": "Veuillez patienter un instant",
        "es": "Espere un momento, por favor",
    },
    "limit.start": {
        "en": "Many people on your network are starting this survey right now. Please try again in a minute.",
        "de": "Gerade beginnen viele Personen in Ihrem Netzwerk diese Umfrage. Bitte versuchen Sie es in einer Minute noch einmal.",
        "fr": "Beaucoup de personnes de votre réseau commencent cette enquête en ce moment. Veuillez réessayer dans une minute.",
        "es": "Muchas personas de su red están empezando esta encuesta en este momento. Por favor, inténtelo de nuevo dentro de un minuto.",
    },
    "limit.post": {
        "en": "Many answers were sent from your network just now, so this one was not saved. Please try again in a minute.",
        "de": "Gerade wurden viele Antworten aus Ihrem Netzwerk gesendet, daher wurde diese nicht gespeichert. Bitte versuchen Sie es in einer Minute noch einmal.",
        "fr": "De nombreuses réponses viennent d’être envoyées depuis votre réseau : celle-ci n’a donc pas été enregistrée. Veuillez réessayer dans une minute.",
        "es": "Se acaban de enviar muchas respuestas desde su red, así que esta no se guardó. Por favor, inténtelo de nuevo dentro de un minuto.",
    },
    "page_error.title": {
        "en": "This page cannot be shown",
        "de": "Diese Seite kann nicht angezeigt werden",
        "fr": "Cette page ne peut pas être affichée",
        "es": "Esta página no se puede mostrar",
    },
    "page_error.text": {
        "en": "{reason}",
        "de": "Bitte prüfen Sie den Link, den Sie erhalten haben (Grund: {reason}).",
        "fr": "Veuillez vérifier le lien qui vous a été donné (motif : {reason}).",
        "es": "Por favor, compruebe el enlace que recibió (motivo: {reason}).",
    },
    "not_found.title": {
        "en": "Page not found",
        "de": "Seite nicht gefunden",
        "fr": "Page introuvable",
        "es": "Página no encontrada",
    },
    "not_found.text": {
        "en": "This address is not a page of a survey here. Please check the link you were given, or open it again from your invitation.",
        "de": "Diese Adresse ist hier keine Seite einer Umfrage. Bitte prüfen Sie den Link, den Sie erhalten haben, oder öffnen Sie ihn erneut aus Ihrer Einladung.",
        "fr": "Cette adresse ne correspond à aucune page d’enquête ici. Veuillez vérifier le lien qui vous a été donné, ou rouvrez-le depuis votre invitation.",
        "es": "Esta dirección no corresponde a ninguna página de encuesta de este sitio. Por favor, compruebe el enlace que recibió o vuelva a abrirlo desde su invitación.",
    },
    "unavailable.title": {
        "en": "Temporarily unavailable",
        "de": "Vorübergehend nicht verfügbar",
        "fr": "Temporairement indisponible",
        "es": "No disponible temporalmente",
    },
    "unavailable.text": {
        "en": "This survey is temporarily unavailable. Please try again in a few minutes.",
        "de": "Diese Umfrage ist vorübergehend nicht verfügbar. Bitte versuchen Sie es in einigen Minuten noch einmal.",
        "fr": "Cette enquête est temporairement indisponible. Veuillez réessayer dans quelques minutes.",
        "es": "Esta encuesta no está disponible temporalmente. Por favor, inténtelo de nuevo dentro de unos minutos.",
    },
    # ----- a group round member's link (/g/{token}) ---------------------------------------
    "round.closed_title": {
        "en": "This round is closed",
        "de": "Diese Runde ist geschlossen",
        "fr": "Ce tour est clos",
        "es": "Esta ronda está cerrada",
    },
    "round.closed_text": {
        "en": "Round {number} of this survey is closed: answers are no longer accepted. Thank you for your interest.",
        "de": "Runde {number} dieser Umfrage ist geschlossen: Es werden keine Antworten mehr angenommen. Vielen Dank für Ihr Interesse.",
        "fr": "Le tour {number} de cette enquête est clos : les réponses ne sont plus acceptées. Merci de votre intérêt.",
        "es": "La ronda {number} de esta encuesta está cerrada: ya no se aceptan respuestas. Gracias por su interés.",
    },
    "round.paused_title": {
        "en": "Survey paused",
        "de": "Umfrage pausiert",
        "fr": "Enquête en pause",
        "es": "Encuesta en pausa",
    },
    "round.paused_text": {
        "en": "This survey is not accepting answers at the moment. Your link is still valid: please try again later.",
        "de": "Diese Umfrage nimmt im Moment keine Antworten an. Ihr Link ist weiterhin gültig: Bitte versuchen Sie es später noch einmal.",
        "fr": "Cette enquête n’accepte pas de réponses pour le moment. Votre lien reste valide : veuillez réessayer plus tard.",
        "es": "Esta encuesta no acepta respuestas en este momento. Su enlace sigue siendo válido: por favor, inténtelo de nuevo más tarde.",
    },
    "round.thanks_skipped": {
        "en": "You preferred not to answer; that was recorded. You can close this page now.",
        "de": "Sie wollten nicht antworten; das wurde gespeichert. Sie können diese Seite jetzt schließen.",
        "fr": "Vous avez préféré ne pas répondre ; c’est enregistré. Vous pouvez maintenant fermer cette page.",
        "es": "Prefirió no responder; quedó registrado. Ya puede cerrar esta página.",
    },
    "round.thanks_answered": {
        "en": "Your answer was saved. You can close this page now.",
        "de": "Ihre Antwort wurde gespeichert. Sie können diese Seite jetzt schließen.",
        "fr": "Votre réponse a été enregistrée. Vous pouvez maintenant fermer cette page.",
        "es": "Su respuesta se ha guardado. Ya puede cerrar esta página.",
    },
    "round.thanks_recorded": {
        "en": "Your reply was recorded. You can close this page now.",
        "de": "Ihre Rückmeldung wurde gespeichert. Sie können diese Seite jetzt schließen.",
        "fr": "Votre réponse a été prise en compte. Vous pouvez maintenant fermer cette page.",
        "es": "Su respuesta quedó registrada. Ya puede cerrar esta página.",
    },
    "round.already_title": {
        "en": "Already answered",
        "de": "Bereits beantwortet",
        "fr": "Déjà répondu",
        "es": "Pregunta ya respondida",
    },
    "round.already_text": {
        "en": "You have already answered this question; thank you. You can close this page now.",
        "de": "Sie haben diese Frage bereits beantwortet; vielen Dank. Sie können diese Seite jetzt schließen.",
        "fr": "Vous avez déjà répondu à cette question ; merci. Vous pouvez maintenant fermer cette page.",
        "es": "Ya ha respondido a esta pregunta; gracias. Ya puede cerrar esta página.",
    },
    "round.other_question": {
        "en": "That answer was for another question, so it was not saved: this link asks the question below.",
        "de": "Diese Antwort galt einer anderen Frage und wurde daher nicht gespeichert: Dieser Link stellt die unten stehende Frage.",
        "fr": "Cette réponse concernait une autre question ; elle n’a donc pas été enregistrée : ce lien pose la question ci-dessous.",
        "es": "Esa respuesta era para otra pregunta, así que no se guardó: este enlace hace la pregunta de abajo.",
    },
}
"""Every text of the respondent pages: ``{message id: {language: text or plural forms}}``."""

_FORMATTER = string.Formatter()
_FRENCH_SPACE = re.compile(r" ([:;?!»])|(«) ")
_PERCENT_SPACE = re.compile(r" %")


def supported_language(value: object) -> Language:
    """``value`` when it is a supported language code, else :data:`DEFAULT_LANGUAGE`."""
    for language in LANGUAGES:
        if value == language:
            return language
    return DEFAULT_LANGUAGE


def language_of(settings: Mapping[str, Any] | None) -> Language:
    """The respondent pages' language of a study's stored settings (``study.settings``):
    its ``language``, English when unset."""
    return supported_language((settings or {}).get("language"))


def plural_category(language: str, count: int) -> Literal["one", "other"]:
    """The plural form for ``count`` (CLDR's rule for integers): French takes the singular
    for 0 and 1 ("0 réponse"), English, German and Spanish for 1 only."""
    if language == "fr":
        return "one" if count in (0, 1) else "other"
    return "one" if count == 1 else "other"


@functools.cache  # a fixed set of (language, message) pairs, typeset on every page render
def _typeset(language: str, template: str) -> str:
    """No-break spaces where :data:`MESSAGES` writes plain ones, so that a line never
    starts with the sign: before ``%`` ("89 %"), and in French before ``: ; ? ! »`` and
    after ``«``."""
    template = _PERCENT_SPACE.sub("\u00a0%", template)
    if language != "fr":
        return template
    return _FRENCH_SPACE.sub(lambda m: f"\u00a0{m[1]}" if m[1] else f"{m[2]}\u00a0", template)


def pattern(language: str, key: str, count: int | None = None) -> str:
    """The text of message ``key`` in ``language`` (English for an unknown language) with
    its placeholders unfilled; for a plural message, its form for ``count``.

    Raises:
        KeyError: ``key`` is no message (a bug of the caller).
    """
    lang = supported_language(language)
    texts = MESSAGES[key][lang]
    if isinstance(texts, dict):
        texts = texts[plural_category(lang, count if count is not None else 0)]
    return _typeset(lang, texts)


def text(language: str, key: str, /, **params: Any) -> str:
    """Message ``key`` in ``language`` with ``params`` filled in (``count`` chooses the
    plural form). Example: ``text("es", "count.skipped", count=2)`` is ``"2 preguntas que
    prefirió no responder"``."""
    count = params.get("count")
    return pattern(language, key, count if isinstance(count, int) else None).format(**params)


@dataclass(frozen=True)
class Words:
    """Message ``key`` with its ``params``, not yet in a language: what a caller gives a
    page that finds its language itself (:func:`app.routes.respondent.message_page`)."""

    key: str
    params: Mapping[str, Any] = field(default_factory=dict)

    def say(self, language: str) -> str:
        """The message in ``language`` (:func:`text`)."""
        return text(language, self.key, **self.params)


def words(key: str, /, **params: Any) -> Words:
    """:class:`Words` of message ``key``: ``words("round.closed_text", number=2)``."""
    return Words(key, params)


def placeholders(template: str) -> set[str]:
    """The names of the ``{placeholders}`` of ``template``: ``{"count"}`` for
    ``"{count} seconds"``."""
    return {name for _, name, _, _ in _FORMATTER.parse(template) if name is not None}


def listing(language: str, parts: list[str]) -> str:
    """``parts`` as one list in words: ``"a, b and c"``, ``"a, b und c"``."""
    if len(parts) < 2:
        return "".join(parts)
    return text(language, "list.and", rest=", ".join(parts[:-1]), last=parts[-1])


def script_messages(language: str, *, several: bool) -> dict[str, str]:
    """What ``static/js/respondent.js`` says about a form's answer (``several``: a page of
    answers) while it is sent or when sending fails, unfilled (``{label}``: the form's
    primary button, ``{seconds}``: one of the ``seconds`` texts, ``{status}``: the HTTP
    status). The page puts it in the form's ``data-messages`` attribute as JSON."""
    noun = "answers" if several else "answer"
    return {
        "saving": pattern(language, "js.saving"),
        "sendError": pattern(language, f"js.send_error.{noun}"),
        "busy": pattern(language, "js.busy"),
        "secondsOne": pattern(language, "js.seconds", 1),
        "secondsOther": pattern(language, "js.seconds", 2),
        "secondsUnknown": pattern(language, "js.seconds_unknown"),
        "serverError": pattern(language, f"js.server_error.{noun}"),
        "otherError": pattern(language, f"js.other_error.{noun}"),
    }
