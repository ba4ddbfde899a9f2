// Ask before a destructive form submission: a form, or the button that submits it, with
// data-confirm="question" (instead of an inline onsubmit/onclick, which the
// Content-Security-Policy of the admin pages forbids).
document.addEventListener("submit", function (event) {
  var source = (event.submitter && event.submitter.dataset.confirm) || event.target.dataset.confirm;
  if (source && !window.confirm(source)) {
    event.preventDefault();
  }
});
