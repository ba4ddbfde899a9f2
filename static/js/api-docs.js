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
    deepLinking: true,
    persistAuthorization: true,
    displayRequestDuration: true,
    presets: [window.SwaggerUIBundle.presets.apis],
  });
})();
