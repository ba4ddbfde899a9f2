"""``auto`` model choice and the CAPE measures (questions_to_90pct, adaptivity)."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
import torch

from elicitation.bench.methods import get_method
from elicitation.cape_measures import adaptivity_counts, questions_to_fraction
from elicitation.errors import ElicitationError
from elicitation.model_choice import (
    choose_model,
    comparison_rows,
    stack_models,
)
from models.base import DTYPE, MISSING, ItemBank
from models.cape_factor import CapeFactor, sobol_normal


@pytest.fixture(autouse=True, scope="module")
def one_thread():  # type: ignore[no-untyped-def]
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_cape_methods_are_registered() -> None:
    for name in ("cape_cooccurrence", "cape_linear", "cape_factor", "auto"):
        method = get_method(name)
        assert method.name == name and method.criterion is not None


@pytest.mark.parametrize(
    ("curve", "reference", "expected"),
    [
        ([1.0, 0.8, 0.6, 0.55, 0.5], 0.5, 3),  # gain 0.5: need a drop of 0.45
        ([1.0, 0.5, 0.4], 0.5, 1),  # reached the reference after one question
        ([1.0, 0.9, 0.8], 0.0, None),  # the budget is not enough
        ([0.7, 0.7], 0.8, 0),  # answering everything does not help
        ([1.0, 0.95, 0.91, 0.9], 0.9, 2),  # exactly 90% of the gain (0.09 of 0.1) at n = 2
    ],
)
def test_questions_to_fraction(curve: list[float], reference: float, expected: int | None) -> None:
    assert questions_to_fraction(curve, reference) == expected


def test_adaptivity_counts_equal_pair_enumeration() -> None:
    gen = torch.Generator().manual_seed(4)
    cand = [3, 5, 8, 9]
    b = 40
    answers = torch.randint(0, 3, (b, 4), generator=gen)
    first = torch.tensor(cand)[torch.randint(0, 2, (b,), generator=gen)]
    second = torch.tensor(cand)[torch.randint(2, 4, (b,), generator=gen)]
    asked = torch.stack([first, second], 1)
    asked[0, 1] = MISSING  # a user with no second question is left out
    differ, pairs = adaptivity_counts(asked, answers, cand)
    col = {c: k for k, c in enumerate(cand)}
    want_pairs = want_differ = 0
    for u, v in itertools.combinations(range(b), 2):
        if MISSING in (int(asked[u, 1]), int(asked[v, 1])):
            continue
        if asked[u, 0] != asked[v, 0]:
            continue
        k = col[int(asked[u, 0])]
        if answers[u, k] == answers[v, k]:
            continue
        want_pairs += 1
        want_differ += int(asked[u, 1] != asked[v, 1])
    assert (differ, pairs) == (want_differ, want_pairs)
    assert 0 < differ < pairs


def test_adaptivity_of_a_fixed_order_is_zero() -> None:
    answers = torch.tensor([[0, 1], [1, 0], [1, 1]])
    asked = torch.tensor([[4, 7], [4, 7], [4, 7]])
    assert adaptivity_counts(asked, answers, [4, 7]) == (0, 2)


def _factor_case() -> tuple[CapeFactor, CapeFactor, torch.Tensor]:
    """A true latent-factor model, an independent-items model with its marginals, data."""
    gen = torch.Generator().manual_seed(2)
    bank = ItemBank(tuple(f"q{i}" for i in range(6)), (2, 2, 3, 2, 2, 3))
    w = 2.0 * torch.randn(6, 3, 1, generator=gen, dtype=DTYPE)
    b = 0.3 * torch.randn(6, 3, generator=gen, dtype=DTYPE)
    true = CapeFactor(bank, w, b, sobol_normal(512, 1, seed=0))
    z = torch.randn(300, 1, generator=gen, dtype=DTYPE)
    logits = (b + torch.einsum("iod,nd->nio", w, z)).masked_fill(~bank.option_mask(), -math.inf)
    probs = logits.softmax(-1).reshape(-1, logits.shape[-1])
    y = torch.multinomial(probs, 1, generator=gen).reshape(300, 6)  # not the global RNG
    marg = true.predict(true.initial_state())  # the same marginals, no correlations
    flat = CapeFactor(
        bank,
        torch.zeros(6, 3, 1, dtype=DTYPE),
        marg.clamp_min(1e-12).log(),
        sobol_normal(512, 1, seed=0),
    )
    return true, flat, y


def test_choose_model_keeps_the_model_that_predicts_targets() -> None:
    true, flat, y = _factor_case()
    choice = choose_model(
        {"independent": flat, "factor": true},
        y,
        observed_items=[0],
        candidates=[1, 2, 3],
        targets=[4, 5],
        budget=3,
    )
    assert choice.chosen == "factor" and choice.model is true
    rows = {r["name"]: r for r in choice.table}
    assert rows["factor"]["chosen"] and not rows["independent"]["chosen"]
    assert len(rows["factor"]["log_loss"]) == 4
    # the independent model cannot learn from answers: a flat curve; the factor model improves
    assert max(rows["independent"]["log_loss"]) - min(rows["independent"]["log_loss"]) < 1e-9
    assert rows["factor"]["log_loss"][3] < rows["factor"]["log_loss"][0] - 0.05
    assert rows["factor"]["mean_log_loss"] < rows["independent"]["mean_log_loss"]


def test_choose_model_refuses_empty_input() -> None:
    true, _, y = _factor_case()
    with pytest.raises(ElicitationError, match="no candidate models"):
        choose_model({}, y, observed_items=[], candidates=[1], targets=[2])
    none = torch.full_like(y, MISSING)
    with pytest.raises(ElicitationError, match="answered a target"):
        choose_model({"m": true}, none, observed_items=[], candidates=[1], targets=[2])


def test_stack_models_weights_the_model_that_predicts_targets() -> None:
    """``auto``'s stacked mixture: the table scores every candidate on the shared path,
    the mixture's validation loss is <= each candidate's at every budget (its weights
    were fitted to minimise it), and the weights go to the model that predicts."""
    from models.cape_mixture import StackedMixture

    true, flat, y = _factor_case()
    choice = stack_models(
        {"independent": flat, "factor": true},
        y,
        observed_items=[0],
        candidates=[1, 2, 3],
        targets=[4, 5],
        budget=3,
    )
    assert choice.chosen == "stacked_mixture" and isinstance(choice.model, StackedMixture)
    rows = {r["name"]: r for r in choice.table}
    assert set(rows) == {"independent", "factor", "stacked_mixture"}
    assert rows["stacked_mixture"]["chosen"] and not rows["factor"]["chosen"]
    for n in range(4):
        best_single = min(rows["independent"]["log_loss"][n], rows["factor"]["log_loss"][n])
        assert rows["stacked_mixture"]["log_loss"][n] <= best_single + 1e-9
    weights = rows["stacked_mixture"]["weights_by_n"]
    assert all(w > 0.5 for w in weights["factor"][1:])  # once answers are in, the factor model
    short = comparison_rows(choice.table)
    assert [r["name"] for r in short] == ["independent", "factor", "stacked_mixture"]
    assert short[2]["chosen"] and short[1]["log_loss_T"] == rows["factor"]["log_loss"][-1]
    with pytest.raises(ElicitationError, match="no candidate models"):
        stack_models({}, y, observed_items=[], candidates=[1], targets=[2])


def test_markdown_tables_show_every_method_and_measure() -> None:
    from elicitation.bench.report import markdown_tables

    result = {
        "budget": 2,
        "methods": {
            "a": {
                "log_loss": [0.7, 0.6, 0.5],
                "accuracy": [0.5, 0.6, 0.7],
                "questions_to_90pct": None,
                "log_loss_all_candidates": 0.4,
                "adaptivity": 0.25,
                "adaptivity_pairs": 8,
            },
            "full": {"log_loss": [0.4] * 3, "accuracy": [0.8] * 3},
        },
    }
    text = markdown_tables(result, budgets=(0, 2, 5))
    assert "| log_loss | 0 | 2 |" in text and "| a | 0.7000 | 0.5000 |" in text
    assert "| a | > 2 | 0.4000 | 0.250 (8) |" in text
    assert "| full | 0.8000 | 0.8000 |" in text


def test_merge_results_combines_methods_and_run_slices_exactly() -> None:
    from elicitation.cape_measures import merge_results
    from elicitation.errors import BenchmarkError

    def part(runs: list[int], methods: dict[str, Any]) -> dict[str, Any]:
        return {"dataset": "d", "budget": 2, "protocol": {"runs": runs}, "methods": methods}

    def entry(seed: int, ll: list[float]) -> dict[str, Any]:
        return {
            "seed": seed,
            "log_loss": ll,
            "accuracy": [0.5] * 3,
            "brier_mean": [0.1] * 3,
            "brier_sum": [0.2] * 3,
        }

    def method(entries: list[dict[str, Any]], ref: float, a: float, pairs: int) -> dict[str, Any]:
        n = len(entries)
        return {
            "log_loss": [sum(e["log_loss"][t] for e in entries) / n for t in range(3)],
            "per_run": entries,
            "log_loss_all_candidates": ref,
            "adaptivity": a,
            "adaptivity_pairs": pairs,
            "seconds": 1.0,
        }

    a1 = method([entry(0, [1.0, 0.9, 0.8]), entry(1, [1.0, 0.7, 0.6])], 0.5, 0.5, 10)
    a2 = method([entry(2, [1.0, 1.0, 1.0])], 0.8, 0.25, 30)
    b = method([entry(s, [1.0, 0.6, 0.5]) for s in (0, 1, 2)], 0.5, 0.0, 5)
    merged = merge_results(
        [part([0, 1], {"a": a1}), part([2], {"a": a2}), part([0, 1, 2], {"b": b})]
    )
    res = merged["methods"]["a"]
    assert [e["seed"] for e in res["per_run"]] == [0, 1, 2]
    assert res["log_loss"] == pytest.approx([1.0, 2.6 / 3, 2.4 / 3])
    assert res["log_loss_all_candidates"] == pytest.approx((2 * 0.5 + 0.8) / 3)
    assert res["adaptivity"] == pytest.approx((0.5 * 10 + 0.25 * 30) / 40)
    assert res["adaptivity_pairs"] == 40
    # gain 1 - 0.6 = 0.4; 90% of it needs 1 - 0.36 = 0.64 -> not reached by 0.8: > budget
    assert res["questions_to_90pct"] is None
    assert merged["methods"]["b"] == b and merged["protocol"]["runs"] == [0, 1, 2]
    with pytest.raises(BenchmarkError, match="twice"):
        merge_results([part([0, 1], {"a": a1}), part([1], {"a": a2})])
    with pytest.raises(BenchmarkError, match="runs"):
        merge_results([part([0, 1], {"a": a1}), part([0, 1, 2], {"b": b})])


# ----- auto: one model choice over the family table ----------------------------------------


def _auto_ctx(y: torch.Tensor, bank: ItemBank, **options: Any) -> Any:
    from elicitation.bench.methods import FitContext

    return FitContext(
        bank,
        y[:200],
        y[200:],
        [0],
        [1, 2, 3],
        [4, 5],
        seed=0,
        options={"latent_classes": {"n_classes": (2,), "n_restarts": 1}, **options},
    )


def test_stack_beats_single_needs_more_than_its_standard_error() -> None:
    from elicitation.model_choice import stack_beats_single

    single = torch.tensor([1.0, 1.0, 1.0, 1.0])
    tied = stack_beats_single(torch.tensor([0.9, 1.1, 0.9, 1.1]), single, 4)
    assert tied["gain"] == pytest.approx(0.0) and not tied["stack"]
    worse = stack_beats_single(torch.tensor([1.1, 1.0, 1.05, 1.0]), single, 4)
    assert worse["gain"] < 0 and not worse["stack"]
    better = stack_beats_single(torch.tensor([0.5, 0.6, 0.5, 0.6]), single, 4)
    assert better["gain"] == pytest.approx(0.45) and better["se"] < 0.1 and better["stack"]


def test_auto_never_ships_a_model_that_validates_worse_than_its_best_single(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The true factor model and an independent-items model: their stack, scored out of
    fold, validates worse than the true model alone, so ``auto`` ships the true model (a
    rule that always ships the stack, as before, fails this test)."""
    from elicitation import model_choice as mc

    true, flat, y = _factor_case()
    monkeypatch.setitem(mc.FAMILIES, "t_flat", mc.Family("t_flat", lambda c: flat, lambda c: flat))
    monkeypatch.setitem(mc.FAMILIES, "t_true", mc.Family("t_true", lambda c: true, lambda c: true))
    model = mc.fit_auto(_auto_ctx(y, true.item_bank, auto={"families": ("t_flat", "t_true")}))
    rows = {r["name"]: r for r in model.metrics["auto_table"]["table"]}
    assert set(rows) == {"t_flat", "t_true", "stacked_mixture"}
    shipped = [name for name, r in rows.items() if r["chosen"]]
    assert shipped == ["t_true"] and model.metrics["auto_chosen"] == "t_true"
    assert rows["stacked_mixture"]["mean_log_loss"] > rows["t_true"]["mean_log_loss"]
    assert rows["t_true"]["mean_log_loss"] == min(r["mean_log_loss"] for r in rows.values())
    rule = model.metrics["model_choice_rule"]
    assert rule["best_single"] == "t_true" and not rule["stack"] and rule["gain"] <= rule["se"]
    assert model.family == true.family and model.metrics is not true.metrics


def test_auto_skips_persona_candidates_without_a_dictionary_and_says_why() -> None:
    from elicitation import model_choice as mc

    _, _, y = _factor_case()
    bank = ItemBank(tuple(f"q{i}" for i in range(6)), (2, 2, 3, 2, 2, 3))
    families = ("latent_classes", "persona_mixture", "mixed")
    model = mc.fit_auto(_auto_ctx(y, bank, auto={"families": families}))
    skipped = model.metrics["model_choice_skipped"]
    assert set(skipped) == {"persona_mixture", "mixed"}
    assert all("no persona dictionary" in why for why in skipped.values())
    shown = {r["family"] if "skipped" in r else r["name"]: r for r in model.metrics["model_choice"]}
    assert "no persona dictionary" in shown["mixed"]["name"] and not shown["mixed"]["chosen"]
    assert model.metrics["auto_chosen"] == "latent_classes"  # the only candidate left


def test_app_and_benchmark_auto_are_one_code_path() -> None:
    """``fit_belief_model("auto")`` (the app's fit job) and the benchmark's ``auto``
    (``fit_auto`` on a FitContext) choose the same family with the same validation
    scores; with a persona dictionary the persona candidates take part."""
    from elicitation import model_choice as mc

    _, _, y = _factor_case()
    bank = ItemBank(tuple(f"q{i}" for i in range(6)), (2, 2, 3, 2, 2, 3))
    gen = torch.Generator().manual_seed(5)
    mu = torch.rand(4, 6, 3, generator=gen, dtype=DTYPE) * bank.option_mask()
    mu = mu / mu.sum(-1, keepdim=True)
    families = ("latent_classes", "cape_cooccurrence", "persona_mixture", "mixed")
    small = {"cape_cooccurrence": {"betas": (0.1,), "etas": (0.5,), "lams": (0.5,)}}
    opts = {**small, "auto": {"families": families}}
    bench = mc.fit_auto(_auto_ctx(y, bank, personas={"mu": mu}, **opts))
    app = mc.fit_belief_model(
        "auto",
        y[:200],
        y[200:],
        bank,
        demographics=[0],
        candidates=[1, 2, 3],
        targets=[4, 5],
        seed=0,
        latent_class_options={"n_classes": (2,), "n_restarts": 1},
        fit_options=opts,
        personas=mu,
    )
    assert app.metrics["auto_chosen"] == bench.metrics["auto_chosen"]
    assert app.family == bench.family
    score = {r["name"]: r["mean_log_loss"] for r in bench.metrics["model_choice"]}
    assert {r["name"]: r["mean_log_loss"] for r in app.metrics["model_choice"]} == score
    assert set(score) == {*families, "stacked_mixture"} and not app.metrics["model_choice_skipped"]


def test_auto_on_a_young_study_skips_what_it_cannot_fit_and_ships_without_a_comparison() -> None:
    """A study's first respondents: with 9 training and 2 validation users every family
    fits (``cape_linear`` has more factors than respondents); with 3 and 1, ``cape_linear``
    is skipped, naming why; with validation users who answered no target, nothing can be
    compared and the first candidate (latent classes) ships, the metrics saying so."""
    from elicitation import model_choice as mc

    _, _, y = _factor_case()
    bank = ItemBank(tuple(f"q{i}" for i in range(6)), (2, 2, 3, 2, 2, 3))
    kw: dict[str, Any] = {
        "demographics": [0],
        "candidates": [1, 2, 3],
        "targets": [4, 5],
        "latent_class_options": {"n_classes": (2,), "n_restarts": 1},
        "fit_options": {"cape_factor": {"dims": (1,), "steps": 30}},
    }
    nine = mc.fit_belief_model("auto", y[:9], y[9:11], bank, **kw)
    assert set(nine.metrics["model_choice_skipped"]) == {"persona_mixture", "mixed"}
    assert nine.metrics["model_choice_respondents"] == 2
    three = mc.fit_belief_model("auto", y[:3], y[3:4], bank, **kw)
    assert (
        "needs at least 2 training and 2 validation"
        in (three.metrics["model_choice_skipped"]["cape_linear"])
    )
    no_targets = y[20:23].clone()
    no_targets[:, [4, 5]] = MISSING
    blind = mc.fit_belief_model("auto", y[:9], no_targets, bank, **kw)
    assert blind.metrics["auto_chosen"] == "latent_classes"
    assert blind.metrics["model_choice_respondents"] == 0
    assert (
        "no validation respondent has answered a target"
        in (blind.metrics["model_choice_rule"]["unscored"])
    )
    chosen = [r["name"] for r in blind.metrics["model_choice"] if r["chosen"]]
    assert chosen == ["latent_classes"]


def test_auto_with_a_handful_of_respondents_and_no_validation_ships_latent_classes() -> None:
    """Fewer than ``AUTO_MIN_UNSPLIT`` respondents, none set aside for validation: the
    fit does not fail (a study's refits would fail until its 10th respondent); latent
    classes ship, unscored, the metrics saying why."""
    from elicitation import model_choice as mc

    _, _, y = _factor_case()
    bank = ItemBank(tuple(f"q{i}" for i in range(6)), (2, 2, 3, 2, 2, 3))
    model = mc.fit_belief_model(
        "auto",
        y[:5],
        None,
        bank,
        demographics=[0],
        candidates=[1, 2, 3],
        targets=[4, 5],
        latent_class_options={"n_classes": (2,), "n_restarts": 1},
    )
    assert model.metrics["auto_chosen"] == "latent_classes"
    assert model.metrics["model_choice_respondents"] == 0
    assert "5 respondents and none set aside" in model.metrics["model_choice_rule"]["unscored"]
