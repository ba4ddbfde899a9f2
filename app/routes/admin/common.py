"""What the admin routes share: the page a route answers with, the submitted form, and how
a user error in a form becomes an inline message.

* :data:`PageDep` (:class:`Page`): render a template with the logged-in researcher and
  the CSRF token, or redirect (303) to a named route.
* :data:`FormDep` (:class:`FormFields`): the submitted form, read as text fields, checkboxes,
  optional numbers (an empty field is ``None``, anything else must parse) and files.
* :func:`user_error_message` / :func:`error_status`: a user error
  (:func:`app.errors.is_user_error`) is shown in the re-rendered form; any other exception
  propagates (a bug keeps its traceback and becomes a 500).
"""

from __future__ import annotations

import re
from typing import Annotated, Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from fastapi import Depends, Request
from fastapi.responses import RedirectResponse, Response
from starlette.datastructures import FormData

from app import auth
from app.deps import MAX_DB_ID, TemplatesDep, form_str
from app.errors import InvalidInputError, PriorlyError, is_user_error
from app.limits import FORM_FIELD_MAX_BYTES


def render(
    request: Request,
    templates: Any,
    name: str,
    context: dict[str, Any],
    *,
    block: str | None = None,
    status: int = 200,
) -> Response:
    """Template ``name`` (or only its ``block``) with ``context``, the logged-in researcher
    and the CSRF token. A refused form (``status >= 400`` on a request whose form was read
    by :data:`FormDep`) also passes what was typed, ``posted`` (its text fields) and
    ``posted_to`` (the last segment of the path it was posted to), so that the page shows
    the typed values again (the template global ``kept``, :mod:`app.templating`)."""
    form = getattr(request.state, "form", None) if status >= 400 else None
    ctx = {
        "researcher": getattr(request.state, "researcher", None),
        "csrf_token": auth.csrf_token(request),
        "posted": {k: v for k, v in form.multi_items() if isinstance(v, str) and k != "csrf_token"}
        if form is not None
        else None,
        "posted_to": request.url.path.rstrip("/").rsplit("/", 1)[-1],
        **context,
    }
    if block is not None:
        return templates.TemplateResponse(request, name, ctx, block_name=block, status_code=status)
    return templates.TemplateResponse(request, name, ctx, status_code=status)


def see_other(url: str) -> RedirectResponse:
    """A 303 redirect to ``url`` (a reload of the target does not post again)."""
    return RedirectResponse(url, status_code=303)


class Page:
    """Dependency: the request and the templates, to answer with a page or a redirect."""

    def __init__(self, request: Request, templates: TemplatesDep) -> None:
        self.request = request
        self.templates = templates

    def render(
        self, name: str, context: dict[str, Any], *, block: str | None = None, status: int = 200
    ) -> Response:
        """See :func:`render`."""
        return render(self.request, self.templates, name, context, block=block, status=status)

    def url(self, route: str, **params: Any) -> str:
        """The absolute URL of the named route."""
        return str(self.request.url_for(route, **params))

    def redirect(
        self, route: str, *, query: dict[str, Any] | None = None, **params: Any
    ) -> Response:
        """303 to the named route (with ``query`` parameters, if any)."""
        url = self.request.url_for(route, **params)
        return see_other(str(url.include_query_params(**query) if query else url))

    @property
    def htmx(self) -> bool:
        """Whether htmx sent the request (it swaps a block of the page, not the page)."""
        return bool(self.request.headers.get("hx-request"))

    def reload(self) -> Response:
        """Tell htmx to load the page it is on again, without its one-time ``notice``.

        The page's address comes from htmx's ``HX-Current-URL`` header; only its path and
        query are used, and only for an admin page (anything else: ``HX-Refresh``).
        Example: on ``/admin/studies/s/personas?notice=job+%235+started`` the answer is
        ``HX-Redirect: /admin/studies/s/personas``, so a finished or cancelled job no
        longer sits under "job #5 started".
        """
        current = urlsplit(self.request.headers.get("hx-current-url", ""))
        if not current.path.startswith("/admin/"):
            return Response(status_code=200, headers={"HX-Refresh": "true"})
        query = urlencode([(k, v) for k, v in parse_qsl(current.query) if k != "notice"])
        target = current.path + (f"?{query}" if query else "")
        return Response(status_code=200, headers={"HX-Redirect": target})


PageDep = Annotated[Page, Depends(Page)]


_NUMBER = {
    int: (re.compile(r"[+-]?[0-9]+"), "a whole number"),
    float: (re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?"), "a number"),
}
"""What a form's number field accepts: ASCII digits only (``int`` and ``float`` also
take ``1_000``, Arabic-Indic digits, ``inf`` and ``nan``), and how the error calls it."""


def opt_number(value: str, kind: type[int] | type[float], name: str) -> Any:
    """``None`` for an empty field, else the field as ``kind``.

    Raises:
        InvalidInputError: naming the field, e.g. ``max_questions: not a whole number:
            '3.5'`` (the value clipped).
    """
    value = value.strip()
    if not value:
        return None
    pattern, what = _NUMBER[kind]
    if len(value) > 40 or not pattern.fullmatch(value):  # int() refuses 4,300+ digits
        shown = value if len(value) <= 40 else value[:40] + "…"
        raise InvalidInputError(f"{name}: not {what}: {shown!r}")
    return kind(value)


class FormFields:
    """The submitted form of a request, read field by field; ``labels`` (field name →
    the label the page shows) name a field in number errors, else its name does."""

    def __init__(self, form: FormData, labels: dict[str, str] | None = None) -> None:
        self.form = form
        self.labels = labels or {}

    def with_labels(self, labels: dict[str, str]) -> FormFields:
        """The same form, its number errors naming fields by ``labels``."""
        return FormFields(self.form, labels)

    def text(self, name: str, default: str = "") -> str:
        """See :func:`app.deps.form_str`."""
        return form_str(self.form, name, default)

    def texts(self) -> list[tuple[str, str]]:
        """Every text field as ``(name, text)``, in the order sent (a name given twice is
        there twice; files are left out)."""
        return [(k, v) for k, v in self.form.multi_items() if isinstance(v, str)]

    def checked(self, name: str) -> bool:
        """Whether the checkbox ``name`` is ticked."""
        return self.text(name) == "on"

    def opt_int(self, name: str) -> int | None:
        """The field as a whole number, ``None`` when empty (InvalidInputError otherwise)."""
        return opt_number(self.text(name), int, self.labels.get(name, name))  # type: ignore[no-any-return]

    def opt_float(self, name: str) -> float | None:
        """The field as a number, ``None`` when empty (InvalidInputError otherwise)."""
        return opt_number(self.text(name), float, self.labels.get(name, name))  # type: ignore[no-any-return]

    def opt_share(self, name: str) -> float | None:
        """The field as a fraction: a number (``0.1``) or a percentage (``10%`` is
        ``0.1``); ``None`` when empty (InvalidInputError otherwise)."""
        text = self.text(name).strip()
        if not text.endswith("%"):
            return self.opt_float(name)
        value = opt_number(text[:-1], float, self.labels.get(name, name))
        return None if value is None else value / 100

    def opt_id(self, name: str) -> int | None:
        """The field as a row's id, ``None`` when empty; InvalidInputError for anything but
        a whole number from 1 to :data:`app.deps.MAX_DB_ID`."""
        value = self.opt_int(name)
        if value is not None and not 1 <= value <= MAX_DB_ID:
            raise InvalidInputError(f"{name}: not an id (1 to {MAX_DB_ID}): {value}")
        return value

    async def files(self, names: tuple[str, ...], *, max_bytes: int) -> dict[str, bytes]:
        """The uploaded files among ``names`` (a field without a file is left out); a file
        declared larger than ``max_bytes`` is an InvalidInputError."""
        out: dict[str, bytes] = {}
        for name in names:
            upload = self.form.get(name)
            if upload is not None and not isinstance(upload, str) and upload.filename:
                if upload.size is not None and upload.size > max_bytes:
                    raise InvalidInputError(f"{name} is larger than the upload limit")
                out[name] = await upload.read()
        return out

    async def upload(self, name: str, *, max_bytes: int) -> tuple[str, bytes] | None:
        """The uploaded file ``name`` as ``(file name, bytes)``, ``None`` when no file was
        chosen; a file larger than ``max_bytes`` is an InvalidInputError."""
        upload = self.form.get(name)
        if upload is None or isinstance(upload, str) or not upload.filename:
            return None
        data = await upload.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise InvalidInputError(f"{upload.filename}: larger than {max_bytes} bytes")
        return upload.filename, data

    async def named_files(
        self, field: str, names: tuple[str, ...], *, max_bytes: int
    ) -> dict[str, bytes]:
        """The files chosen together in the multiple-file field ``field``, keyed by their
        file names, each of which must be one of ``names`` (a folder part of the name is
        ignored), e.g. ``{"responses.csv": b"...", "codebook.jsonl": b"..."}``; an unknown
        or repeated name, or a file declared larger than ``max_bytes``, is an
        InvalidInputError. An empty field gives ``{}``."""
        out: dict[str, bytes] = {}
        for upload in self.form.getlist(field):
            if isinstance(upload, str) or not upload.filename:
                continue
            name = upload.filename.replace("\\", "/").rsplit("/", 1)[-1]
            if name not in names:
                raise InvalidInputError(
                    f"{field}: {name!r} is not one of the expected files ({', '.join(names)})"
                )
            if name in out:
                raise InvalidInputError(f"{field}: {name!r} chosen twice")
            if upload.size is not None and upload.size > max_bytes:
                raise InvalidInputError(f"{name} is larger than the upload limit")
            out[name] = await upload.read()
        return out


async def read_form(request: Request) -> FormFields:
    """Dependency: the request's form (parsed once; the CSRF check reads the same; kept on
    ``request.state.form`` for :func:`render` to show a refused form's values again)."""
    form = await request.form(max_part_size=FORM_FIELD_MAX_BYTES)
    request.state.form = form
    return FormFields(form)


FormDep = Annotated[FormFields, Depends(read_form)]


def user_error_message(exc: Exception) -> str:
    """The message of a user error, to show in the form; any other exception is raised
    again."""
    if not is_user_error(exc):
        raise exc
    return str(exc)


def error_status(exc: Exception) -> int:
    """The status of a user error in a form: its own (409 conflict, 404, ...) or 422."""
    return exc.http_status if isinstance(exc, PriorlyError) else 422
