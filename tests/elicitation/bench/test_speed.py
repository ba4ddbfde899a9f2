"""The speed benchmark on a small persona dictionary (schema and input validation only)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from elicitation.bench.speed import load_persona_dictionary, run_speed
from elicitation.errors import BenchmarkError


def _write_personas(folder: Path, k: int = 12, items: int = 8, seed: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    ids = [f"Q{i}" for i in range(items)]
    ans = torch.randint(1, 5, (k, items), generator=gen)
    lines = ["," + ",".join(ids)] + [
        f"p{r}," + ",".join(str(int(v)) for v in ans[r]) for r in range(k)
    ]
    (folder / "persona_answers_deterministic.csv").write_text("\n".join(lines) + "\n")
    meta = {q: {"question": q, "answer_scale_min": 1, "answer_scale_max": 4} for q in ids}
    (folder / "question_metadata.json").write_text(json.dumps(meta))
    return folder


def test_dictionary_is_epsilon_smoothed(tmp_path: Path) -> None:
    folder = _write_personas(tmp_path / "p")
    model = load_persona_dictionary(folder, 0.05)
    assert model.n_personas == 12 and model.item_bank.n_options == (4,) * 8
    assert float(model.mu.max()) == pytest.approx(0.95)
    assert float(model.mu.min()) == pytest.approx(0.05 / 3)


def test_speed_result_schema(tmp_path: Path) -> None:
    folder = _write_personas(tmp_path / "p")
    res = run_speed(folder, steps=30, batch=16, batch_steps=3, warmup=2, questions_per_respondent=4)
    assert res["steps"] == 30 and res["batch_size"] == 16
    assert 0 < res["p50_ms"] <= res["p99_ms"] <= res["max_ms"]
    assert res["batch_steps_per_second"] > 0
    assert len(res["targets"]) == 5 and res["candidates"] == 3
    assert res["criterion"] == "eig" and "criterion=eig" in res["step"]
    json.dumps(res)


def test_speed_of_another_criterion(tmp_path: Path) -> None:
    folder = _write_personas(tmp_path / "p")
    res = run_speed(
        folder,
        steps=10,
        batch=8,
        batch_steps=2,
        warmup=1,
        questions_per_respondent=3,
        criterion="eig2",
    )
    assert res["criterion"] == "eig2" and "criterion=eig2" in res["step"]
    assert res["steps"] == 10 and res["p50_cpu_ms"] > 0
    with pytest.raises(BenchmarkError, match="unknown selection criterion 'nope'"):
        run_speed(folder, steps=2, criterion="nope")


def test_bad_dictionary(tmp_path: Path) -> None:
    folder = _write_personas(tmp_path / "p")
    path = folder / "persona_answers_deterministic.csv"
    lines = path.read_text().splitlines()
    lines[3] = lines[3].rsplit(",", 1)[0] + ",7"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(BenchmarkError, match=r"row 3, column 'Q7': 7 is off the scale"):
        load_persona_dictionary(folder, 0.05)
    with pytest.raises(BenchmarkError, match="steps must be >= 1"):
        run_speed(folder, steps=0)


def test_speed_grows_and_compresses_the_dictionary(tmp_path: Path) -> None:
    """``--personas N`` grows the dictionary to N; above 2,000 the live step runs on the
    500 prototypes the app's live persona prior would use; ``none`` keeps them all."""
    from elicitation.bench.speed import grow_dictionary

    folder = _write_personas(tmp_path / "p")
    base = load_persona_dictionary(folder, 0.05)
    grown = grow_dictionary(base, 50, 0.05, seed=1)
    assert grown.n_personas == 50 and grown.item_bank == base.item_bank
    modal = base.mu.argmax(-1)
    # every grown persona is a base persona with some answers redrawn
    same = (grown.mu.argmax(-1).unsqueeze(1) == modal.unsqueeze(0)).float().mean(-1)
    assert float(same.max(1).values.min()) >= 0.25
    res = run_speed(
        folder, n_personas=2001, steps=5, batch=4, batch_steps=2, warmup=1,
        questions_per_respondent=3, criterion="eig",
    )  # fmt: skip
    assert res["personas"] == 2001 and res["live_personas"] == 500
    assert res["compression"] == "auto" and res["compression_cpu_seconds"] > 0
    res = run_speed(
        folder, n_personas=60, compress="none", steps=5, batch=4, batch_steps=2, warmup=1,
        questions_per_respondent=3, criterion="eig",
    )  # fmt: skip
    assert res["personas"] == res["live_personas"] == 60
    assert res["compression_cpu_seconds"] is None
    with pytest.raises(BenchmarkError, match="--compress"):
        run_speed(folder, compress="some")
