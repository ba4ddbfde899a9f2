"""HTTP routes: ``pages`` (full HTML), ``hx`` (htmx partials), ``api`` (JSON under /api/v1)."""
