"""Errors of the ``inference_server`` package: one base and a few specific kinds.

``app/`` maps these to HTTP codes and error partials in one place; code here raises them
with a message that says what went wrong and where (which persona, item, server URL).
"""

from __future__ import annotations


class InferenceError(Exception):
    """Base error of the ``inference_server`` package."""


class PersonaError(InferenceError, ValueError):
    """A persona dictionary or persona text is invalid (empty text, bad file, bad ε)."""


class PromptError(InferenceError, ValueError):
    """An item cannot be turned into a prompt (no options, too many options, bad letters)."""


class BackendError(InferenceError):
    """A backend could not produce a distribution.

    Raised when a server is down, times out, or answers something that is not a valid
    response; a backend never returns a distribution it could not read in full.
    """


class ModelNotFoundError(InferenceError, FileNotFoundError):
    """The model weights are not installed locally (nothing is downloaded at run time)."""


class ServerError(InferenceError):
    """The vLLM server process could not be set up or started."""
