"""``priorly bench lifecycle``: one-line user errors (exit 2), the JSON's keys and shapes,
and a replay that goes through the product's own session, refit and promotion code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlmodel import Session, col, select

from app.cli import main
from app.db import make_engine
from app.services.importer import import_dataset
from app.services.lifecycle_bench import METHODS, parse_arrivals
from app.tables import (
    Answer,
    ElicitationSession,
    FittedModel,
    Item,
    Respondent,
    RespondentSource,
    SelectionDecision,
    Study,
)
from elicitation.datasets import load_dataset
from tests.support.data import write_small_dataset

REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 80 CES respondents (26 train + 4 val arriving, 23 test users)."""
    return write_small_dataset(
        REPO_ROOT / "datasets" / "ces", tmp_path_factory.mktemp("lc") / "ces-small", 80
    )


@pytest.fixture(scope="module")
def replay(small: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    """One run, arrivals 0 and 20, budget 2, two calibration questions per live
    respondent; its database kept."""
    folder = tmp_path_factory.mktemp("lc-out")
    out = folder / "r.json"
    code = main(
        [
            "bench", "lifecycle", "--dataset", str(small), "--arrivals", "0,20", "--budget", "2",
            "--runs", "1", "--calibration-items", "2", "--out", str(out),
            "--keep-db", str(folder / "db"),
        ]
    )  # fmt: skip
    assert code == 0
    return json.loads(out.read_text()), folder / "db"


def _err(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    line = err.splitlines()[0]
    assert line.startswith("priorly: error: "), line
    return line


def test_parse_arrivals() -> None:
    assert parse_arrivals("0,50, 200,800") == [0, 50, 200, 800]
    assert parse_arrivals("7") == [7]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--arrivals", "0,x"], "--arrivals: not an integer list"),
        (["--arrivals", "50,20"], "--arrivals: counts must increase"),
        (["--arrivals", "-5"], "--arrivals: counts must be >= 0"),
        (["--arrivals", "0,,5"], "--arrivals: expected comma-separated counts"),
        (["--arrivals", "0,31"], "31 arrivals but dataset"),
        (["--budget", "-1"], "--budget must be >= 0"),
        (["--runs", "0"], "--runs must be between 1 and"),
        (["--runs", "99"], "--runs must be between 1 and"),
        (["--calibration-items", "10"], "--calibration-items must be between 0 and 9"),
        (["--live-questions", "0"], "--live-questions must be >= 1"),
        (["--threads", "0"], "--threads must be >= 1"),
    ],
)
def test_user_errors(
    small: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    out = tmp_path / "r.json"
    code = main(["bench", "lifecycle", "--dataset", str(small), "--out", str(out), *extra])
    assert code == 2
    assert message in _err(capsys)
    assert not out.exists()  # nothing half-written


def test_missing_dataset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["bench", "lifecycle", "--dataset", str(tmp_path / "nope"), "--out", str(tmp_path / "r")]
    )
    assert code == 2 and "not found" in _err(capsys)


def test_json_keys_and_shapes(replay: tuple[dict, Path]) -> None:
    result, _ = replay
    assert result["arrivals"] == [0, 20] and result["budget"] == 2
    assert result["dataset"] == load_dataset(REPO_ROOT / "datasets" / "ces").name
    assert list(result["methods"]) == list(METHODS)
    for name, res in result["methods"].items():
        for metric in ("accuracy", "log_loss"):
            assert len(res[metric]) == 2, name
            assert all(len(curve) == 3 for curve in res[metric]), name
            assert len(res["per_run"]) == 1
            assert len(res["per_run"][0][metric]) == 2
        assert all(0.0 <= a <= 1.0 for curve in res["accuracy"] for a in curve)
        assert all(v > 0.0 for curve in res["log_loss"] for v in curve)
    uniform = result["methods"]["uniform"]
    assert uniform["log_loss"][1] == uniform["log_loss"][0]
    assert uniform["accuracy"][1] == uniform["accuracy"][0]
    # the cold start of a study without personas is the uniform prior
    assert result["methods"]["default"]["log_loss"][0] == pytest.approx(uniform["log_loss"][0])
    full = result["methods"]["full_history"]
    assert full["log_loss"][0] == full["log_loss"][1]
    # after 20 live respondents the refitted model beats the uniform prior
    assert result["methods"]["default"]["log_loss"][1][0] < uniform["log_loss"][1][0]


def test_replay_went_through_the_product(replay: tuple[dict, Path], small: Path) -> None:
    """The kept database holds the 20 live sessions (10 questions each, the arriving users'
    recorded answers or skips), no imported respondent, and the promoted refit counting
    the live respondents."""
    result, folder = replay
    engine = make_engine(f"sqlite:///{folder / 'lifecycle-0.db'}")
    ds = load_dataset(small)
    try:
        with Session(engine) as db:
            study = db.exec(select(Study)).one()
            sessions = db.exec(select(ElicitationSession)).all()
            assert len(sessions) == 20
            assert all(s.status == "completed" and not s.is_preview for s in sessions)
            respondents = db.exec(select(Respondent)).all()
            assert {r.source for r in respondents} == {RespondentSource.live.value}
            items = {it.id: it for it in db.exec(select(Item)).all()}
            run = ds.runs[0]
            roles = {it.key: it.role for it in items.values()}
            assert {k for k, r in roles.items() if r == "target"} == set(run.eval_qids)
            assert {k for k, r in roles.items() if r == "question"} == set(run.cand_qids)
            answers = db.exec(select(Answer).order_by(col(Answer.id))).all()
            assert len(answers) == 20 * 10
            by_session = {s.id: s.respondent_id for s in sessions}
            ext = {r.id: r for r in respondents}
            # every stored answer is the arriving user's recorded one, or a skip where the
            # data has none; the arriving users are the run's first 20 in its seeded order
            arriving = {*ds.split["train_users"], *ds.split["val_users"]}
            assert {r.external_id for r in respondents} <= arriving
            n_answered = 0
            for a in answers:
                user = ext[by_session[a.session_id]].external_id
                key = items[a.item_id].key
                code = int(ds.matrix(keys=[key], users=[user])[0, 0])
                expected = ds.item(key).letters[code] if code >= 0 else None
                assert a.option == expected, (user, key)
                n_answered += a.option is not None
            assert n_answered > 100
            models = db.exec(select(FittedModel).order_by(col(FittedModel.id))).all()
            assert models[0].status == "promoted" and models[0].n_live == 0
            assert models[-1].n_live > 0 and models[-1].n_live + models[-1].n_validation <= 20
            active = [m for m in models if m.is_active]
            assert len(active) == 1
            checkpoints = result["methods"]["default"]["per_run"][0]["checkpoints"]
            assert checkpoints[-1]["model_id"] == active[0].id
            assert study.settings["refit_every"] == 0
            assert study.settings["calibration_items"] == 2
            calibration = db.exec(
                select(SelectionDecision).where(
                    SelectionDecision.criterion == "calibration",
                    col(SelectionDecision.item_id).is_not(None),
                )
            ).all()
            assert len(calibration) == 20 * 2  # places 8 and 9 of every session
    finally:
        engine.dispose()


def test_import_without_respondents(small: Path, sqlite_url: str) -> None:
    from app.db import upgrade

    upgrade(sqlite_url)
    engine = make_engine(sqlite_url)
    try:
        with Session(engine) as db:
            result = import_dataset(small, session=db, respondents=False)
            assert (result.n_respondents, result.n_answers) == (0, 0)
            assert db.exec(select(Respondent)).all() == []
            assert len(db.exec(select(Item)).all()) == result.n_items
    finally:
        engine.dispose()
