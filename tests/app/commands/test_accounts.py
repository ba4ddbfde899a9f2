"""``priorly user create`` and ``priorly apikey create|list|revoke`` on a real SQLite file."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import text
from sqlmodel import Session

from app.cli import main
from app.db import make_engine
from app.services.apikeys import AuthenticationError, authenticate_api_key
from app.settings import get_settings


@pytest.fixture
def cli_db(migrated_sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("PRIORLY_DATABASE_URL", migrated_sqlite_url)
    get_settings.cache_clear()
    yield migrated_sqlite_url
    get_settings.cache_clear()


def test_user_and_apikey_commands(cli_db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["user", "create", "--email", " Ada@Example.org ", "--admin"]) == 0
    assert "created admin ada@example.org" in capsys.readouterr().out
    assert main(["user", "create", "--email", "ada@example.org"]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["user", "create", "--email", "not-an-email"]) == 2
    assert "not a valid email" in capsys.readouterr().err
    assert main(["user", "create", "--email", "ada\u202e@example.org"]) == 2
    assert "bidirectional control character (U+202E) at position 3" in capsys.readouterr().err
    assert main(["apikey", "create", "--email", "nobody@example.org"]) == 2
    assert "no researcher with email" in capsys.readouterr().err

    assert main(["apikey", "create", "--email", "ADA@example.org", "--name", "ci"]) == 0
    out = capsys.readouterr()
    key = out.out.strip()
    assert key.startswith("pk_") and len(key) > 40 and "not shown again" in out.err
    engine = make_engine(cli_db)
    try:
        with Session(engine) as db:
            assert authenticate_api_key(key, session=db).email == "ada@example.org"
            # only the hash is stored: the key appears in no column
            dump = " ".join(str(r) for r in db.connection().execute(text("SELECT * FROM api_key")))
            assert key not in dump and key.split("_")[2] not in dump
        assert main(["apikey", "list", "--email", "ada@example.org"]) == 0
        listing = capsys.readouterr().out
        assert key[:11] in listing and "active" in listing and key not in listing
        assert main(["apikey", "list"]) == 0  # every key, with its researcher
        listing = capsys.readouterr().out.splitlines()
        assert listing[0] == "prefix\tstate\tcreated\tlast used\tname\tresearcher"
        assert listing[1].startswith(key[:11] + "\tactive\t")
        assert listing[1].endswith("\t-\tci\tada@example.org")
        # a name stored before control characters were refused is printed escaped
        with Session(engine) as db:
            db.connection().execute(text("UPDATE api_key SET name = :n"), {"n": "a\x1b[2Jb"})
            db.commit()
        assert main(["apikey", "list"]) == 0
        listing = capsys.readouterr().out
        assert "\x1b" not in listing and "a\\x1b[2Jb" in listing
        assert main(["apikey", "create", "--email", "ada@example.org", "--name", "x\ry"]) == 2
        assert "the key name contains a control character (U+000D)" in capsys.readouterr().err
        assert main(["apikey", "revoke", key[:11]]) == 0
        assert capsys.readouterr().out.strip() == f"revoked {key[:11]}"
        assert main(["apikey", "revoke", key[:11]]) == 0
        assert "was already revoked on" in capsys.readouterr().out
        with Session(engine) as db, pytest.raises(AuthenticationError, match="revoked"):
            authenticate_api_key(key, session=db)
    finally:
        engine.dispose()
