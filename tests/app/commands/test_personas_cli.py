"""``priorly personas bench`` and ``generate``: the command's own logic (server, model and
key from the options or ``PRIORLY_LLM_*``, stdout holding only the JSON, one-line errors,
help texts). The OpenAI-compatible server is ``tests.support.fake_vllm`` (a real HTTP
server with known answers); vLLM itself is tested in ``tests/inference_server/test_vllm.py``."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from app.cli import main
from app.settings import get_settings
from inference_server.model_store import DEFAULT_MODEL
from inference_server.server import free_port
from tests.support.fake_vllm import FakeVLLM

BENCH = ["personas", "bench", "--backend", "openai", "--personas", "1", "--items", "2"]


@pytest.fixture
def llm_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    for name in ("PRIORLY_LLM_BASE_URL", "PRIORLY_LLM_MODEL", "PRIORLY_LLM_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    get_settings.cache_clear()
    yield monkeypatch
    get_settings.cache_clear()


def _set(mp: pytest.MonkeyPatch, **env: str) -> None:
    for k, v in env.items():
        mp.setenv(k, v)
    get_settings.cache_clear()


def test_bench_openai_without_url_is_one_line(
    llm_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(BENCH) == 2
    err = capsys.readouterr().err
    assert (
        err.strip() == "priorly: error: --backend openai needs --base-url or PRIORLY_LLM_BASE_URL"
    )


def test_bench_openai_reads_the_url_setting(
    llm_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The server of PRIORLY_LLM_BASE_URL is used (was: ValueError traceback); a server that
    is down is one line naming it, before any dataset work."""
    url = f"http://127.0.0.1:{free_port()}"
    _set(llm_env, PRIORLY_LLM_BASE_URL=url)
    assert main(BENCH) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and f"{url}/v1/models: cannot reach the inference server" in lines[0]


def test_bench_openai_model_and_key_from_settings_and_json_only_on_stdout(
    llm_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeVLLM()
    try:
        _set(
            llm_env,
            PRIORLY_LLM_BASE_URL=fake.url,
            PRIORLY_LLM_MODEL="some/other-model",
            PRIORLY_LLM_API_KEY="s3cret-key",
        )
        # the model comes from the setting: the fake serves only the embedded model
        assert main(BENCH) == 2
        err = capsys.readouterr().err
        assert f"does not serve 'some/other-model'; it serves: {DEFAULT_MODEL}" in err
        assert fake.requests == 0 and "s3cret-key" not in err
        # --model wins over the setting
        assert main([*BENCH, "--batch-sizes", "1,2", "--model", DEFAULT_MODEL]) == 0
        captured = capsys.readouterr()
        result = json.loads(captured.out)  # stdout is the JSON alone
        assert result["config"]["model"] == DEFAULT_MODEL
        assert result["config"]["cpu_seconds_measured"] == "client"
        assert result["config"]["pairs_per_config"] == 2
        assert [r["batch_size"] for r in result["rows"]] == [1, 2]
        for row in result["rows"]:
            assert set(row) == {
                "backend", "batch_size", "prefix_reuse", "pairs_per_second",
                "pairs_per_cpu_second",
            }  # fmt: skip
            assert row["backend"] == "openai" and row["prefix_reuse"] is None
        assert len(captured.err.strip().splitlines()) == 2  # a progress line per row
        assert fake.authorization == {"Bearer s3cret-key"}
    finally:
        fake.close()


def test_bench_model_option_only_for_openai(
    llm_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["personas", "bench", "--model", DEFAULT_MODEL]) == 2
    err = capsys.readouterr().err
    assert (
        err.strip() == "priorly: error: --model and --base-url are for --backend openai, not local"
    )


@pytest.mark.parametrize("action", ["generate", "bench"])
def test_help_names_the_fallbacks(action: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["personas", action, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for needle in ("PRIORLY_LLM_BASE_URL", "PRIORLY_LLM_MODEL", "PRIORLY_LLM_API_KEY"):
        assert needle in text
    assert f"else the embedded model's served name ({DEFAULT_MODEL}" in text
    assert "the API key comes only from the environment" in text
    if action == "bench":
        assert "Standard output holds only the JSON result" in text
