"""Which language model's persona distributions a study uses, and which inference server a
persona generation job calls.

Distributions are stored per ``(model id, template version)`` (a *group*), shared by every
study (:class:`app.tables.PersonaDistribution`), so a study whose personas were scored by
two models has two groups. Its persona prior (:func:`app.services.belief.persona_prior_model`)
and its Personas page use one of them, :func:`prior_group`: the model of the study's newest
persona generation job whose model has stored distributions for it, so switching models
never mixes two models' answers and the page counts what the prior uses.

A generation job started from the Personas page carries the server the researcher saw
(``base_url`` and ``model`` of the web process's ``PRIORLY_LLM_*`` settings; never the API
key, only whether one was set): a worker started without those settings still calls that
server, and a worker whose own settings disagree fails the job saying which
(:func:`job_server`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlmodel import Session, col, select

from app.errors import ConfigurationError
from app.settings import Settings
from app.tables import Job
from inference_server.model_store import DEFAULT_MODEL

Group = tuple[str, str]
"""``(model id, template version)`` of stored distributions."""

JOBS_LOOKED_AT = 200
"""The newest persona generation jobs of a study :func:`prior_group` looks at."""


def job_model(job: Job) -> str | None:
    """The model id a persona generation job scores with: its result's ``model_id``, else
    its payload's ``model_id`` (the CLI's resolved model) or ``model`` (the Personas
    page's), else the embedded model for a ``local`` job; ``None`` when the job does not say
    (a server job from before the payload named its model)."""
    result, payload = job.result or {}, job.payload or {}
    named = result.get("model_id") or payload.get("model_id") or payload.get("model")
    if named:
        return str(named)
    return DEFAULT_MODEL if payload.get("backend", "local") == "local" else None


def prior_group(study_id: int, counts: Mapping[Group, int], *, session: Session) -> Group | None:
    """The group of stored distributions the study's persona prior uses.

    ``counts``: the study's stored persona × item distributions per group. The group is
    that of the model of the study's newest persona generation job (:func:`job_model`)
    among the models of ``counts`` (with two template versions of that model, the one with
    more rows); without such a job, the group with the most rows (ties: the larger name).
    ``None`` when ``counts`` is empty.

    Example: counts ``{("SmolLM2", "v1-a"): 171, ("Qwen3-8B", "v1-a"): 128}`` and the
    newest job scored with ``Qwen3-8B`` (even a cancelled one) give ``("Qwen3-8B", "v1-a")``.
    """
    if not counts:
        return None
    models = {m for m, _ in counts}
    jobs = session.exec(
        select(Job)
        .where(Job.study_id == study_id, Job.kind == "persona_generation")
        .order_by(col(Job.id).desc())
        .limit(JOBS_LOOKED_AT)
    ).all()
    chosen = next((m for m in map(job_model, jobs) if m in models), None)
    candidates = [g for g in counts if chosen is None or g[0] == chosen]
    return max(candidates, key=lambda g: (counts[g], g))


def server_root(url: str) -> str:
    """An inference server URL without its trailing ``/`` and ``/v1``, as the openai
    backend's ``root_url``: ``server_root("http://h:8001/v1/") == "http://h:8001"``."""
    return url.rstrip("/").removesuffix("/v1")


def job_server(payload: Mapping[str, Any], settings: Settings) -> tuple[str, str]:
    """``(base URL, model)`` of an ``openai`` persona job: the payload's (what the Personas
    page offered), else the settings of the process running the job.

    Raises:
        ConfigurationError: no server anywhere; the worker's ``PRIORLY_LLM_BASE_URL`` or
            ``PRIORLY_LLM_MODEL`` is set and differs from the payload's; or the page had
            ``PRIORLY_LLM_API_KEY`` (payload ``api_key_set``) and the worker has none. The
            message names the setting and the process, e.g. "the worker running this job
            has no PRIORLY_LLM_API_KEY: set it for `priorly worker` too".
    """
    same = "give `priorly worker` the same PRIORLY_LLM_* settings as `priorly serve`"
    url = payload.get("base_url") or settings.llm_base_url
    if not url:
        raise ConfigurationError(
            "the worker running this job has no PRIORLY_LLM_BASE_URL and the job names no "
            "inference server: set it for `priorly worker` too"
        )
    if settings.llm_base_url and server_root(settings.llm_base_url) != server_root(str(url)):
        raise ConfigurationError(
            f"the worker running this job has PRIORLY_LLM_BASE_URL={settings.llm_base_url}, "
            f"but the job was started for the inference server {url}: {same}"
        )
    model = str(payload.get("model") or settings.llm_model or DEFAULT_MODEL)
    if settings.llm_model and settings.llm_model != model:
        raise ConfigurationError(
            f"the worker running this job has PRIORLY_LLM_MODEL={settings.llm_model}, but "
            f"the job was started for the model {model}: {same}"
        )
    if payload.get("api_key_set") and settings.llm_api_key is None:
        raise ConfigurationError(
            "the worker running this job has no PRIORLY_LLM_API_KEY: set it for "
            "`priorly worker` too"
        )
    return str(url), model
