// The survey forms (hx-post inside #survey): what htmx leaves to the page.
//
// While an answer is being sent the form is aria-busy, says "Saving…" ([data-send-status])
// and its options take no click or key (the values htmx sent stay the ones shown; the
// inputs are never disabled, which would leave them out of the request). When sending
// fails, htmx swaps nothing: the choices stay, and the form's alert ([data-send-error])
// says what happened and what to do. A refusal that is a whole page (the survey closed
// meanwhile: 404, 409, 410) replaces the page, as a plain form's answer would.
(function () {
  "use strict";

  function surveyForm(event) {
    var elt = event.detail && event.detail.elt;
    var form = elt && elt.closest ? elt.closest("form") : null;
    return form && form.closest("#survey") ? form : null;
  }

  function label(form) {
    var button = form.querySelector("button.r-primary");
    return button ? button.textContent.trim() : "Next";
  }

  function answer(form) {
    return form.getAttribute("data-answer-noun") || "answer";
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

  function seconds(value) {
    var n = parseInt(value, 10);
    if (!(n > 0)) return "a few seconds";
    return n === 1 ? "a second" : n + " seconds";
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
    setText(form, "[data-send-status]", "Saving…");
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
    showError(form, "Your " + answer(form) + " could not be sent. Check your connection " +
      "and press " + label(form) + " again.");
  });

  document.addEventListener("htmx:responseError", function (event) {
    var form = surveyForm(event);
    if (!form) return;
    var xhr = event.detail.xhr;
    var noun = answer(form);
    var not = noun === "answer" ? " was not saved" : " were not saved";
    if (xhr.status === 429) {
      showError(form, "Too many answers from your network just now: please wait " +
        seconds(xhr.getResponseHeader("Retry-After")) + " and press " + label(form) + " again.");
    } else if (xhr.status >= 500) {
      showError(form, "Something went wrong on our side; your " + noun + not +
        ". Please press " + label(form) + " again.");
    } else if (!showPage(xhr)) {
      showError(form, "Your " + noun + not + " (error " + xhr.status +
        "). Please reload the page and try again.");
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
