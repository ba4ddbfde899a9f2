"""Persona answer distributions from language models (docs/methods.md §1).

A persona is a text (a researcher's description, a sentence built from a respondent's
attributes, or an imported persona id). For every persona × item pair a language model
is asked the item as that persona, and its next-token probabilities of the option letters
give the persona's answer distribution ``μ[θ, i, :]``.

Modules:

* :mod:`inference_server.personas` — persona dictionaries (texts, from dataset
  attributes, imported deterministic answer matrices);
* :mod:`inference_server.prompts` — the versioned prompt template and letter scoring;
* :mod:`inference_server.backends` — ``local`` (transformers on the CPU) and ``openai``
  (any OpenAI-compatible server, first of all vLLM) behind one interface;
* :mod:`inference_server.model_store` — the embedded SmolLM2 model, converted once to a
  cached safetensors folder;
* :mod:`inference_server.server` — the launcher of a vLLM OpenAI-compatible server;
* :mod:`inference_server.bench` — the throughput benchmark.

This package never imports the web app, the database layer or settings: callers pass
explicit arguments.

Example (the embedded model on the CPU; ``μ`` for two personas and one item)::

    from inference_server.backends import make_backend
    from inference_server.backends.base import ScoreRequest
    from inference_server.prompts import PromptItem

    item = PromptItem(key="q1", question="Do you support the policy?", options=("Support", "Oppose"))
    backend = make_backend("local")
    scores = backend.score([ScoreRequest(p, item) for p in ("A retired farmer.", "A student.")])
    mu = [s.probs for s in scores]            # two distributions over (Support, Oppose)
"""

from inference_server.errors import (
    BackendError,
    InferenceError,
    ModelNotFoundError,
    PersonaError,
    PromptError,
    ServerError,
)

__all__ = [
    "BackendError",
    "InferenceError",
    "ModelNotFoundError",
    "PersonaError",
    "PromptError",
    "ServerError",
]
