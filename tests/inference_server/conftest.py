"""Run the vLLM integration test last in the session.

``scripts/test`` starts its vLLM server in the background at the beginning of CI; the
later the test that waits for it runs, the more of the suite overlaps the server's start.
"""

from __future__ import annotations

import pytest

LAST = "tests/inference_server/test_vllm.py"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Move the items of :data:`LAST` to the end, keeping every other item's order."""
    first = [it for it in items if not it.nodeid.startswith(LAST)]
    last = [it for it in items if it.nodeid.startswith(LAST)]
    items[:] = first + last
