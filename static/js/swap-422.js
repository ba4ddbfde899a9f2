// htmx does not swap error responses; inside an element marked data-swap-422 a 422 (the
// server's form with its error, e.g. a designer row) replaces its target like a 200. An
// inline hx-on handler would do the same, but the pages' Content-Security-Policy forbids
// evaluating inline script.
document.addEventListener("htmx:beforeSwap", function (event) {
  var elt = event.detail.elt;
  if (event.detail.xhr.status === 422 && elt && elt.closest && elt.closest("[data-swap-422]")) {
    event.detail.shouldSwap = true;
    event.detail.isError = false;
  }
});
