"""Backends that turn persona × item pairs into answer distributions.

``local`` (transformers in-process on the CPU) and ``openai`` (any OpenAI-compatible
server, first of all vLLM) implement :class:`~inference_server.backends.base.Backend`;
:func:`make_backend` builds one by name. Importing this package does not import
transformers or load a model; constructing a backend does.
"""

from inference_server.backends.base import (
    Backend,
    ScoreRequest,
    backend_names,
    make_backend,
    register_backend,
)
from inference_server.backends.local import LocalBackend
from inference_server.backends.openai import OpenAIBackend

__all__ = [
    "Backend",
    "LocalBackend",
    "OpenAIBackend",
    "ScoreRequest",
    "backend_names",
    "make_backend",
    "register_backend",
]
