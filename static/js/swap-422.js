// htmx does not swap error responses; inside an element marked data-swap-422 a 422 or a 409
// (the server's form with its error, e.g. a designer row: invalid input, or a change
// refused while a group round asks the item) replaces its target like a 200. An
// inline hx-on handler would do the same, but the pages' Content-Security-Policy forbids
// evaluating inline script.
document.addEventListener("htmx:beforeSwap", function (event) {
  var elt = event.detail.elt;
  if ((event.detail.xhr.status === 422 || event.detail.xhr.status === 409) && elt && elt.closest && elt.closest("[data-swap-422]")) {
    event.detail.shouldSwap = true;
    event.detail.isError = false;
  }
});
