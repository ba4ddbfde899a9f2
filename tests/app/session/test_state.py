"""Stored belief states: the bytes of ``elicitation_session.state`` load bit for bit,
whichever module path named the tensor reducer when they were written."""

from __future__ import annotations

import io
import pickle
import sys
import types
from typing import Any

import pytest
import torch

from app.session.state import dump_state, load_state, states_equal


def _state() -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    return {"log_w": torch.randn(7, generator=g, dtype=torch.float64), "n": 3, "t": (1, "x")}


def test_dump_and_load_are_exact() -> None:
    state = _state()
    again = load_state(dump_state(state))
    assert states_equal(again, state)
    assert again["log_w"].dtype == torch.float64


def _blob_written_under(module_path: str, state: Any) -> bytes:
    """``state`` pickled as the live loop pickles it, but with the reducer named
    ``module_path._tensor_from_numpy`` (as a database written by that module holds)."""

    def reducer(array: Any) -> torch.Tensor:
        return torch.from_numpy(array)

    reducer.__module__ = module_path
    reducer.__qualname__ = reducer.__name__ = "_tensor_from_numpy"
    fake = types.ModuleType(module_path)
    fake._tensor_from_numpy = reducer  # type: ignore[attr-defined]

    class Pickler(pickle.Pickler):
        def reducer_override(self, obj: Any) -> Any:
            if isinstance(obj, torch.Tensor):
                return reducer, (obj.detach().contiguous().numpy(),)
            return NotImplemented

    saved = sys.modules.get(module_path)
    sys.modules[module_path] = fake
    try:
        buf = io.BytesIO()
        Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(state)
    finally:
        if saved is None:
            del sys.modules[module_path]
        else:
            sys.modules[module_path] = saved
    return buf.getvalue()


def test_states_written_under_the_former_module_path_load() -> None:
    state = _state()
    blob = _blob_written_under("app.services.sessions", state)
    assert b"app.services.sessions" in blob
    assert states_equal(load_state(blob), state)


def test_an_unknown_reducer_path_is_refused() -> None:
    blob = _blob_written_under("no_such_module_of_states", _state())
    with pytest.raises(ModuleNotFoundError):
        load_state(blob)
