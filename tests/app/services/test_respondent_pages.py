"""The respondent pages' wording and links (app/services/respondent_pages.py)."""

from __future__ import annotations

from app.services.respondent_pages import fill_redirect


def test_fill_redirect_placeholders() -> None:
    url = "https://panel.example/done?cc={code}&pid={PROLIFIC_PID}&x={Missing}&lit={not a name}"
    assert fill_redirect(url, "AB12", {"PROLIFIC_PID": "a/b c", "code": "ignored"}) == (
        "https://panel.example/done?cc=AB12&pid=a%2Fb%20c&x=&lit={not a name}"
    )
    assert fill_redirect(url, "AB12", None) == (
        "https://panel.example/done?cc=AB12&pid=&x=&lit={not a name}"
    )
    assert fill_redirect("{code}", "https://evil.example", {}) is None  # never made http(s)
    assert fill_redirect("javascript:alert({code})", "1", {}) is None
    assert fill_redirect("", "1", {}) is None and fill_redirect(None, "1", {}) is None
