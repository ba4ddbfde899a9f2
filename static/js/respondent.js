// The survey forms (hx-post inside #survey): what htmx leaves to the page.
//
// While an answer is being sent the form is aria-busy, says "Saving…" ([data-send-status])
// and its options take no click or key (the values htmx sent stay the ones shown; the
// inputs are never disabled, which would leave them out of the request). When sending
// fails, htmx swaps nothing: the choices stay, and the form's alert ([data-send-error])
// says what happened and what to do. A refusal that is a whole page (the survey closed
// meanwhile: 404, 409, 410) replaces the page, as a plain form's answer would.
//
// The sentences come from the page, in its language: the form's data-messages attribute
// holds them as JSON with {placeholders} ({label}: the form's primary button, {seconds},
// {status}); app/respondent_text.py is their catalogue.
(function () {
  "use strict";

  function surveyForm(event) {
    var elt = event.detail && event.detail.elt;
    var form = elt && elt.closest ? elt.closest("form") : null;
    return form && form.closest("#survey") ? form : null;
  }

  function label(form) {
    var button = form.querySelector("button.r-primary");
    return button ? button.textContent.trim() : "";
  }

  function messages(form) {
    try {
      return JSON.parse(form.getAttribute("data-messages") || "{}");
    } catch (e) {
      return {};
    }
  }

  // Message `key` of the form with its {placeholders} filled from `values`.
  function say(form, key, values) {
    var text = messages(form)[key] || "";
    return text.replace(/\{(\w+)\}/g, function (whole, name) {
      return Object.prototype.hasOwnProperty.call(values || {}, name) ? values[name] : whole;
    });
  }

  function setText(form, selector, text) {
    var box = form.querySelector(selector);
    if (box) {
      box.textContent = text;
      box.hidden = !text;
    }
  }

  function showError(form, text) {
    setText(form, "[data-send-error]", text);
  }

  // Retry-After in words; n >= 1, so n === 1 is the singular in every page language.
  function seconds(form, value) {
    var n = parseInt(value, 10);
    if (!(n > 0)) return say(form, "secondsUnknown");
    return say(form, n === 1 ? "secondsOne" : "secondsOther", { count: String(n) });
  }

  // The response's page in place of this one, when it is a page (its <main>); false if not.
  function showPage(xhr) {
    var type = xhr.getResponseHeader("Content-Type") || "";
    if (type.indexOf("text/html") !== 0) return false;
    var doc = new DOMParser().parseFromString(xhr.responseText, "text/html");
    if (!doc.querySelector("main")) return false;
    document.title = doc.title;
    document.body.replaceWith(document.adoptNode(doc.body));
    var heading = document.querySelector("main h1");
    if (heading) {
      heading.setAttribute("tabindex", "-1");
      heading.focus();
    }
    return true;
  }

  document.addEventListener("htmx:beforeRequest", function (event) {
    var form = surveyForm(event);
    if (!form) return;
    showError(form, "");
    form.setAttribute("aria-busy", "true");
    setText(form, "[data-send-status]", say(form, "saving"));
  });

  document.addEventListener("htmx:afterRequest", function (event) {
    var form = surveyForm(event);
    if (!form) return;
    form.removeAttribute("aria-busy");
    setText(form, "[data-send-status]", "");
  });

  document.addEventListener("htmx:sendError", function (event) {
    var form = surveyForm(event);
    if (!form) return;
    showError(form, say(form, "sendError", { label: label(form) }));
  });

  document.addEventListener("htmx:responseError", function (event) {
    var form = surveyForm(event);
    if (!form) return;
    var xhr = event.detail.xhr;
    if (xhr.status === 429) {
      showError(form, say(form, "busy", {
        seconds: seconds(form, xhr.getResponseHeader("Retry-After")),
        label: label(form),
      }));
    } else if (xhr.status >= 500) {
      showError(form, say(form, "serverError", { label: label(form) }));
    } else if (!showPage(xhr)) {
      showError(form, say(form, "otherError", { status: String(xhr.status) }));
    }
  });

  // While a form is busy its options ignore clicks, taps and the keys that choose.
  function busy(target) {
    return !!(target && target.closest && target.closest("form[aria-busy=true] .r-options"));
  }

  document.addEventListener("click", function (event) {
    if (busy(event.target)) event.preventDefault();
  }, true);

  document.addEventListener("keydown", function (event) {
    if (busy(event.target) && /^(Arrow|Home$|End$| $|Spacebar$)/.test(event.key)) {
      event.preventDefault();
    }
  }, true);
})();
