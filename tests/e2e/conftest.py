"""Fixtures of the browser tests: Chromium and axe-core installed, one headless Chromium per
test module (helpers in :mod:`tests.support.browser`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.browser import chromium, ensure_browser


@pytest.fixture(scope="module")
def browser_ready() -> None:
    """Chromium and axe-core are installed (``scripts/setup-browser`` run if not)."""
    ensure_browser()


@pytest.fixture(scope="module")
def browser(browser_ready: None) -> Iterator[Any]:
    """A headless Chromium (Playwright ``Browser``) shared by the module's tests."""
    with chromium() as b:
        yield b
