"""Fixtures of the belief-model tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """Run each model test on one intra-op thread, then restore the previous setting.

    The tests use small tensors; on a shared, loaded machine torch's thread pool makes
    tiny element-wise ops orders of magnitude slower (threads wait to be scheduled), and
    one thread is also what the numerics are specified and benchmarked on.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
