"""The ``local`` backend on the real embedded SmolLM2-135M-Instruct model and real CES items."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from elicitation.datasets import load_dataset
from inference_server.backends import LocalBackend, ScoreRequest, make_backend
from inference_server.prompts import PromptItem

ROOT = Path(__file__).resolve().parents[2]

PERSONAS = [
    "A 70-year-old conservative Republican man from rural Texas who distrusts the federal "
    "government and opposes new government programs.",
    "A 25-year-old progressive Democrat woman from San Francisco who wants the government "
    "to do much more for health care, the climate and the poor.",
    'A voter who writes <b>bold</b> {{ persona }} {% raw %} & "quotes" {persona}',
]


@pytest.fixture(scope="module")
def items() -> list[PromptItem]:
    ds = load_dataset(ROOT / "datasets" / "ces")
    return [PromptItem.from_codebook(ds.item(k)) for k in ds.questions[:3]]


@pytest.fixture(scope="module")
def backend() -> LocalBackend:
    b = make_backend("local", batch_size=4, prefix_reuse=True, num_threads=1)
    assert isinstance(b, LocalBackend)
    return b


@pytest.fixture(scope="module")
def scored(backend: LocalBackend, items: list[PromptItem]):
    reqs = [ScoreRequest(p, it) for p in PERSONAS for it in items]
    return reqs, backend.score(reqs)


def brute_force(backend: LocalBackend, req: ScoreRequest) -> tuple[list[float], float]:
    """One unbatched forward pass over the full prompt; sum softmax over each letter's tokens."""
    ids = backend.tokenizer(backend.render(req.persona, req.item), add_special_tokens=False)
    with torch.no_grad():
        logits = backend.model(input_ids=torch.tensor([ids["input_ids"]])).logits[0, -1]
    p = torch.softmax(logits.double(), -1)
    decoded = backend.tokenizer.batch_decode([[t] for t in range(len(backend.tokenizer))])
    q = []
    for letter in req.item.letters:
        toks = [t for t, text in enumerate(decoded) if text.strip() == letter]
        q.append(float(p[toks].sum()))
    m = sum(q)
    return [x / m for x in q], m


def test_distributions_sum_to_one(scored, items: list[PromptItem]) -> None:
    reqs, res = scored
    assert len(res) == 9
    for req, r in zip(reqs, res, strict=True):
        assert len(r.probs) == req.item.n_options
        assert sum(r.probs) == pytest.approx(1.0, abs=1e-9)
        assert all(0 <= x <= 1 for x in r.probs)
        assert 0 < r.valid_mass <= 1
        assert r.flagged == (r.valid_mass < 0.5)


def test_contrasting_personas_differ(scored, items: list[PromptItem]) -> None:
    _, res = scored
    n = len(items)
    gaps = [
        max(abs(a - b) for a, b in zip(res[i].probs, res[n + i].probs, strict=True))
        for i in range(n)
    ]
    # float noise is ~1e-6; the 135M model's persona effect is small but real
    assert max(gaps) > 5e-3, gaps


def test_matches_unbatched_brute_force(backend: LocalBackend, scored) -> None:
    reqs, res = scored
    for k in (0, 8):
        probs, mass = brute_force(backend, reqs[k])
        assert res[k].probs == pytest.approx(probs, abs=1e-4)
        assert res[k].valid_mass == pytest.approx(mass, abs=1e-4)


@pytest.mark.parametrize(("batch_size", "prefix_reuse"), [(1, False), (3, False), (2, True)])
def test_batching_and_prefix_reuse_agree(
    backend: LocalBackend, scored, batch_size: int, prefix_reuse: bool
) -> None:
    reqs, res = scored
    reqs, res = reqs[2:6], res[2:6]  # two personas, a prefix change inside the batch
    old = backend.batch_size, backend.prefix_reuse
    backend.batch_size, backend.prefix_reuse = batch_size, prefix_reuse
    try:
        again = backend.score(reqs)
    finally:
        backend.batch_size, backend.prefix_reuse = old
    for a, b in zip(res, again, strict=True):
        assert a.probs == pytest.approx(b.probs, abs=1e-4)


def test_letter_variants(backend: LocalBackend) -> None:
    ids = backend.letter_token_ids()
    for letter in "AB":
        got = set(ids[letter].tolist())
        for variant in (letter, " " + letter):
            (t,) = backend.tokenizer(variant, add_special_tokens=False)["input_ids"]
            assert t in got
        assert all(backend.tokenizer.decode([t]).strip() == letter for t in got)


def test_persona_markup_kept_verbatim(backend: LocalBackend, items: list[PromptItem]) -> None:
    text = backend.render(PERSONAS[2], items[0])
    assert PERSONAS[2] in text
    assert "{persona}" in text and "{{ persona }}" in text
