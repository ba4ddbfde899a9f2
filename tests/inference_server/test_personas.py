"""Persona dictionaries: texts, attribute profiles of real data, imported answer matrices."""

from __future__ import annotations

import hashlib
import itertools
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from elicitation.datasets import load_dataset
from inference_server.errors import PersonaError
from inference_server.personas import (
    MAX_PERSONA_KEY_CHARS,
    attribute_sentence,
    deterministic_mu,
    from_attributes,
    from_texts,
    load_answer_matrix,
    persona_hash,
    read_persona_file,
)

ROOT = Path(__file__).resolve().parents[2]
CES = ROOT / "datasets" / "ces"
WVS = ROOT / "datasets" / "wvs_personas"

NASTY = "<script>alert(\"x\")</script> {{ persona }} {% if 1 %}{persona}{% endif %} &amp; 'q'"


@pytest.fixture(scope="module")
def ces():
    return load_dataset(CES)


def test_hash_is_sha256_of_utf8_text() -> None:
    text = "A retired farmer — naïve about cities"
    assert persona_hash(text) == hashlib.sha256(text.encode("utf-8")).hexdigest()
    (p,) = from_texts([text])
    assert p.hash == persona_hash(text)


def test_texts_kept_verbatim_including_markup() -> None:
    ps = from_texts([NASTY, "  spaced  "])
    assert ps[0].text == NASTY
    assert ps[1].text == "  spaced  "
    assert [p.key for p in ps] == ["persona-1", "persona-2"]


@pytest.mark.parametrize(
    ("texts", "msg"),
    [
        ([], "empty"),
        (["ok", "   "], "persona 2: persona text is empty"),
        (["a", "b", "a"], "persona 3 has the same text as persona 1"),
        (["x\x00y"], "NUL"),
        (["x" * 5000], "5,000 characters"),
    ],
)
def test_bad_texts_rejected(texts: list[str], msg: str) -> None:
    with pytest.raises(PersonaError, match=msg):
        from_texts(texts)


def test_read_persona_files(tmp_path: Path) -> None:
    (tmp_path / "p.txt").write_text("first\n\n" + NASTY + "\n")
    assert [p.text for p in read_persona_file(tmp_path / "p.txt")] == ["first", NASTY]
    rows = [{"text": NASTY, "key": "k1", "weight": 3}, {"text": "plain"}]
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    ps = read_persona_file(tmp_path / "p.jsonl")
    assert (ps[0].key, ps[0].text, ps[0].weight) == ("k1", NASTY, 3.0)
    (tmp_path / "p.json").write_text(json.dumps(["a", "b"]))
    assert [p.text for p in read_persona_file(tmp_path / "p.json")] == ["a", "b"]


@pytest.mark.parametrize(
    ("name", "content", "msg"),
    [
        ("bad.jsonl", '{"text": "a"}\n{oops}\n', "bad.jsonl line 2: invalid JSON"),
        (
            "bad2.jsonl",
            '{"txt": "a"}\n',
            r"bad2.jsonl line 1: unknown fields txt \(the fields are text, key, weight\)$",
        ),
        (
            "w.jsonl",
            '{"text": "a", "weight": -1}\n',
            "w.jsonl line 1: weight must be a positive number",
        ),
        ("dup.txt", "a\nb\na\n", "dup.txt line 3: the same text as dup.txt line 1"),
        (
            "k.jsonl",
            '{"text": "a", "key": "k"}\n{"text": "b", "key": "k"}\n',
            "k.jsonl line 2: the same key 'k' as k.jsonl line 1",
        ),
        ("inf.jsonl", '{"text": "a", "weight": Infinity}\n', "inf.jsonl line 1: weight must be"),
        ("big.jsonl", '{"text": "a", "weight": 1e400}\n', "big.jsonl line 1: weight must be"),
        (
            "huge.jsonl",
            '{"text": "a", "weight": 1' + "0" * 400 + "}\n",
            "huge.jsonl line 1: weight must be .* got a huge integer$",
        ),
        (
            "digits.jsonl",
            '{"text": "a", "weight": 1' + "0" * 5000 + "}\n",
            "digits.jsonl line 1: invalid JSON",
        ),
        ("deep.json", "[" * 100_000 + "]" * 100_000, "deep.json: JSON nested too deeply"),
        (
            "deep.jsonl",
            '{"text": "a", "key": ' + "[" * 100_000 + "]" * 100_000 + "}\n",
            "deep.jsonl line 1: JSON nested too deeply",
        ),
        ("x.csv", "a\n", "x.csv: unknown persona file type .csv: use .txt, .jsonl, .json$"),
        (
            "ko.jsonl",
            '{"text": "a", "key": {"a": 1}}\n',
            "ko.jsonl line 1: key must be a string, got an object$",
        ),
        (
            "kn.jsonl",
            '{"text": "a", "key": 7}\n',
            "kn.jsonl line 1: key must be a string, got a number$",
        ),
        (
            "kb.jsonl",
            '{"text": "a"}\n{"text": "b", "key": " "}\n',
            "kb.jsonl line 2: key is empty$",
        ),
        (
            "kl.jsonl",
            '{"text": "a", "key": "' + "k" * 5000 + '"}\n',
            "kl.jsonl line 1: key has 5,000 characters \\(at most 190\\)$",
        ),
        (
            "tw.jsonl",
            '{"text": "a", "weight": {"w": 2}}\n',
            "tw.jsonl line 1: weight must be .* got an object$",
        ),
        (
            "to.json",
            '[{"text": ["a1"]}]',
            "to.json entry 1: persona text must be a string, got a list$",
        ),
        (
            "su.jsonl",
            '{"text": "a"}\n{"text": "A \\ud800 nurse"}\n',
            r"su.jsonl line 2: persona text contains a lone surrogate \(U\+D800\) at position 2",
        ),
        (
            "sk.jsonl",
            '{"text": "a", "key": "k\\udfff"}\n',
            r"sk.jsonl line 1: key contains a lone surrogate \(U\+DFFF\)",
        ),
        ("e.txt", "\n\n", "no personas"),
    ],
)
def test_bad_persona_files(tmp_path: Path, name: str, content: str, msg: str) -> None:
    (tmp_path / name).write_text(content)
    with pytest.raises(PersonaError, match=msg):
        read_persona_file(tmp_path / name)


def test_only_newlines_end_a_persona_line(tmp_path: Path) -> None:
    """A U+2028/U+2029 line separator, a form feed or U+0085 inside a line of a .txt file
    is part of that persona (``str.splitlines`` would split it in two); ``\\r\\n`` ends a
    line like ``\\n``. In a .jsonl file a raw U+2028 inside a JSON string keeps the line
    one JSON object."""
    (tmp_path / "p.txt").write_bytes("A nurse\u2028in Leeds\r\nA farmer\u2029\x0c\x85x\n".encode())
    assert [p.text for p in read_persona_file(tmp_path / "p.txt")] == [
        "A nurse\u2028in Leeds",
        "A farmer\u2029\x0c\x85x",
    ]
    (tmp_path / "p.jsonl").write_text('{"text": "a\u2028b", "key": "k\u2029"}\n', encoding="utf-8")
    (p,) = read_persona_file(tmp_path / "p.jsonl")
    assert (p.text, p.key) == ("a\u2028b", "k\u2029")


def test_a_key_of_the_limit_is_kept_whole(tmp_path: Path) -> None:
    key = "k" * MAX_PERSONA_KEY_CHARS
    (tmp_path / "p.jsonl").write_text(json.dumps({"text": "a", "key": key}) + "\n")
    assert read_persona_file(tmp_path / "p.jsonl")[0].key == key


def test_attributes_sharing_a_topic_are_named_by_their_questions() -> None:
    from elicitation.datasets import CodebookItem

    def item(key: str, question: str, topic: str) -> CodebookItem:
        return CodebookItem(id=key, question=question, options=[("A", "x"), ("B", "y")],
                            topic=topic)  # fmt: skip

    items = [item("age", "Your age group?", "Demographics"),
             item("region", "Your region?", "Demographics"), item("inc", "Income?", "Money")]  # fmt: skip
    assert attribute_sentence(items, [0, 1, 0]) == "Your age group: x; Your region: y; Money: x."


def test_attribute_sentence_uses_codebook_labels(ces) -> None:
    items = [ces.item(k) for k in ces.demographics]
    opts = [0] * len(items)
    opts[1] = -1  # a missing attribute is left out
    s = attribute_sentence(items, opts)
    parts = s.rstrip(".").split("; ")
    assert len(parts) == len(items) - 1
    for part, item in zip(parts, [it for j, it in enumerate(items) if j != 1], strict=True):
        assert part == f"{item.topic}: {item.options[0][1]}"
    with pytest.raises(PersonaError, match="every attribute missing"):
        attribute_sentence(items, [-1] * len(items))


def test_profiles_count_the_real_respondents(ces) -> None:
    keys = ces.demographics[:2]
    ps = from_attributes(ces, attributes=keys)
    m = ces.matrix(keys)
    m = m[(m != -1).any(axis=1)]
    expected = Counter(map(tuple, m.tolist()))
    assert len(ps) == len(expected)
    assert sum(p.weight for p in ps) == m.shape[0]
    for p in ps:
        prof = tuple(p.attributes[k] for k in keys)
        assert p.weight == expected[prof]
    weights = [p.weight for p in ps]
    assert weights == sorted(weights, reverse=True)
    assert len({p.hash for p in ps}) == len(ps)
    top = from_attributes(ces, attributes=keys, n=3)
    assert [p.text for p in top] == [p.text for p in ps[:3]]


def test_sample_is_seeded_and_merges_duplicates(ces) -> None:
    a = from_attributes(ces, mode="sample", n=50, seed=7)
    b = from_attributes(ces, mode="sample", n=50, seed=7)
    c = from_attributes(ces, mode="sample", n=50, seed=8)
    assert [p.text for p in a] == [p.text for p in b]
    assert [p.text for p in a] != [p.text for p in c]
    assert sum(p.weight for p in a) == 50
    rows = ces.user_indices("train_users")[:20]
    d = from_attributes(ces, rows=rows)
    assert sum(p.weight for p in d) == 20
    with pytest.raises(PersonaError, match="needs n"):
        from_attributes(ces, mode="sample")
    with pytest.raises(PersonaError, match="unknown persona mode"):
        from_attributes(ces, mode="all")


def test_deterministic_mu_brute_force() -> None:
    eps = 0.3
    n_opt = (2, 3, 4)
    answers = torch.tensor([[0, 2, -1], [1, 0, 3]])
    mu = deterministic_mu(answers, n_opt, eps)
    assert mu.shape == (2, 3, 4)
    for t, i in itertools.product(range(2), range(3)):
        for k in range(4):
            a = int(answers[t, i])
            if k >= n_opt[i]:
                want = 0.0
            elif a == -1:
                want = 1 / n_opt[i]
            else:
                want = 1 - eps if k == a else eps / (n_opt[i] - 1)
            assert mu[t, i, k].item() == pytest.approx(want, abs=1e-12)
    with pytest.raises(PersonaError, match="epsilon"):
        deterministic_mu(answers, n_opt, 1.0)


def test_deterministic_mu_matches_persona_mixture() -> None:
    persona = pytest.importorskip("models.persona")
    from models.base import ItemBank

    answers = torch.tensor([[0, 2, -1], [1, 0, 3]])
    bank = ItemBank(("a", "b", "c"), (2, 3, 4))
    mix = persona.PersonaMixture.from_deterministic(answers, bank, 0.2)
    mine = deterministic_mu(answers, bank.n_options, 0.2)
    assert torch.allclose(mix.mu, mine, atol=1e-12)


def test_load_wvs_answer_matrix() -> None:
    am = load_answer_matrix(WVS)
    with (WVS / "persona_answers_deterministic.csv").open() as fh:
        header = fh.readline().strip().split(",")
        first = fh.readline().strip().split(",")
    assert am.item_keys == tuple(header[1:])
    assert am.persona_ids[0] == first[0]
    assert am.answers.shape == (len(am.persona_ids), len(header) - 1)
    meta = json.loads((WVS / "question_metadata.json").read_text())
    lo = [meta[k]["answer_scale_min"] for k in am.item_keys]
    assert am.answers[0].tolist() == [int(v) - m for v, m in zip(first[1:], lo, strict=True)]
    mu = am.distributions(0.5)
    assert torch.allclose(mu.sum(-1), torch.ones(mu.shape[:2], dtype=torch.float64))
    assert np.isclose(float(mu[0, 0, am.answers[0, 0]]), 0.5)


def test_bad_answer_matrix(tmp_path: Path) -> None:
    meta = {"Q1": {"question": "q", "answer_scale_min": 1, "answer_scale_max": 4}}
    (tmp_path / "question_metadata.json").write_text(json.dumps(meta))
    f = tmp_path / "persona_answers_deterministic.csv"
    f.write_text(",Q1\np1,2\np2,7\n")
    with pytest.raises(
        PersonaError, match=r"row 2, column 'Q1': answer 7 is outside the scale 1..4"
    ):
        load_answer_matrix(tmp_path)
    f.write_text(",Q1\np1,x\n")
    with pytest.raises(PersonaError, match="'x' is not an integer answer"):
        load_answer_matrix(tmp_path)
    f.write_text(",Q1,Q9\np1,1,1\n")
    with pytest.raises(PersonaError, match="column 'Q9' has no entry"):
        load_answer_matrix(tmp_path)
    f.write_text(",Q1\np1,1\np1,2\n")
    with pytest.raises(PersonaError, match="duplicate persona id"):
        load_answer_matrix(tmp_path)
    f.write_text(",Q1\np1,\np2,4\n")
    am = load_answer_matrix(tmp_path)
    assert am.answers.tolist() == [[-1], [3]]
