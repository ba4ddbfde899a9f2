"""The groups pages' chart of the imputed target distribution, round by round
(:func:`app.services.group_views.distribution_svg`): titles that keep the end of long
questions sharing a stem, legends outside the panels, a phone layout, and a title that
names the model the figures come from."""

from __future__ import annotations

import re

from matplotlib.backends.backend_agg import FigureCanvasAgg

from app.services.group_views import distribution_figure, distribution_svg, estimate_label

STEM = "Thinking about policing policy, would you support or oppose "
QUESTIONS = {
    "334c": STEM + "increasing the number of police on the street by 10 percent, even if it "
    "means fewer funds for other public services?",
    "334d": STEM + "decreasing the number of police on the street by 10 percent and "
    "increasing funding for other public services?",
}


def _history(weights: list[float], uses_gnn: bool = True) -> dict:
    return {
        "rounds": [0, 1],
        "targets": [
            {
                "item": k,
                "question": q,
                "labels": ["Support", "Oppose"],
                "mean": [[0.93, 0.07], [0.6, 0.4]],  # a line near the top of the panel
                "se": [[0.01, 0.01], [0.02, 0.02]],
            }
            for k, q in QUESTIONS.items()
        ],
        "uses_gnn": uses_gnn,
        "pool_weights": weights,
    }


def _text(svg: str) -> str:
    """The SVG's text as matplotlib writes it (one comment per text element)."""
    return " ".join(re.findall(r"<!-- (.*?) -->", svg))


def test_titles_keep_the_end_of_questions_that_share_a_stem() -> None:
    text = _text(distribution_svg(_history([0.0, 0.0])))
    # the distinguishing ends stay (a cut at 60 characters left both as the same stem)
    assert "fewer funds for other public services?" in text
    assert "increasing funding for other public services?" in text
    assert "Thinking about policing policy" in text


def test_legends_sit_outside_the_panels_and_the_phone_layout_is_one_column() -> None:
    """A legend overlaps no panel (the lines near the top, 0.93, stay visible); on a phone
    the panels are one a row and the figure is drawn 390 px wide."""
    for narrow in (False, True):
        fig = distribution_figure(_history([0.0, 0.0]), narrow=narrow)
        renderer = FigureCanvasAgg(fig).get_renderer()
        fig.draw(renderer)
        axes = [ax for ax in fig.axes if ax.get_visible()]
        assert len(axes) == 2
        for ax in axes:
            legend = ax.get_legend().get_window_extent(renderer)
            assert not any(legend.overlaps(other.get_window_extent(renderer)) for other in axes)
        if narrow:
            assert fig.get_figwidth() * fig.dpi == 390
            assert len({round(ax.get_position().x0, 3) for ax in axes}) == 1  # one column
    assert distribution_svg(_history([0.0]), narrow=True).startswith("<?xml")


def test_the_title_names_the_model_the_figures_come_from() -> None:
    assert estimate_label(False, [0.0]) == "belief model"
    assert estimate_label(True, [0.0, 0.0]) == "belief model (the GNN's pool weight is 0)"
    assert estimate_label(True, [0.15, 0.15]) == "belief model pooled with the GNN (weight 0.15)"
    assert estimate_label(True, [0.0, 0.2]) == "belief model pooled with the GNN (weight 0–0.2)"
    text = _text(distribution_svg(_history([0.0, 0.0])))
    assert "GNN's pool weight is 0" in text and "belief model and GNN" not in text


def test_a_used_or_stale_plan_is_said_in_one_line() -> None:
    """Plan #7 opened as round 2; plan #8 made before round 2 was opened (stale); plan #9
    current; a plan made without a GNN that has been trained since."""
    from app.services.group_views import plan_status
    from app.tables import GroupRound, Job

    rounds = [GroupRound(number=1, plan_job_id=5), GroupRound(number=2, plan_job_id=7)]
    opened = plan_status(Job(id=7, result={"rounds_done": 1}), rounds, gnn_trained=False)
    assert opened == {"opened_as": 2, "stale": False, "gnn_since": False}
    stale = plan_status(Job(id=8, result={"rounds_done": 1}), rounds, gnn_trained=False)
    assert stale["opened_as"] is None and stale["stale"] is True
    current = plan_status(
        Job(id=9, result={"rounds_done": 2, "gnn_model_id": None}), rounds, gnn_trained=True
    )
    assert current == {"opened_as": None, "stale": False, "gnn_since": True}
    assert plan_status(None, rounds, gnn_trained=True)["opened_as"] is None
