// Starts Swagger UI on /api/docs (served from this server, no inline script).
(function () {
  "use strict";
  var root = document.getElementById("swagger-ui");
  if (!root || typeof window.SwaggerUIBundle !== "function") {
    return;
  }
  window.ui = window.SwaggerUIBundle({
    url: root.getAttribute("data-openapi-url"),
    dom_id: "#swagger-ui",
    layout: "BaseLayout",
    // deep links would put a link inside each operation's toggle button (nested controls)
    deepLinking: false,
    // the key stays in the page's memory (not in localStorage): a reload asks for it again
    persistAuthorization: false,
    displayRequestDuration: true,
    // plain JSON (the highlighter's colours on its dark background fail WCAG AA contrast)
    syntaxHighlight: false,
    // no badge from the public validator service: the page asks nothing of another site
    validatorUrl: null,
    presets: [window.SwaggerUIBundle.presets.apis],
  });
  // Swagger UI's copy buttons are icons without a name: give them one for screen readers.
  new MutationObserver(function () {
    root.querySelectorAll(".copy-to-clipboard > button:not([aria-label])").forEach(function (b) {
      b.setAttribute("aria-label", "Copy to clipboard");
    });
  }).observe(root, { childList: true, subtree: true });
})();
