"""kvgate.index.storage.env: the one rule for each thing kvgate takes from the environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvgate.index.storage.env import OFFLINE_DEFAULTS, MissingSecret, model_cache_dir, offline_defaults, secret_from_env


def test_secret_from_env_names_the_setting_and_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVGATE_TEST_SECRET", "s3cret")
    assert secret_from_env("KVGATE_TEST_SECRET", "store.password_env") == "s3cret"
    assert secret_from_env(None, "store.password_env") is None  # no variable named: no secret
    monkeypatch.delenv("KVGATE_TEST_SECRET")
    with pytest.raises(
        MissingSecret, match="^store.password_env: the environment variable KVGATE_TEST_SECRET is not set"
    ):
        secret_from_env("KVGATE_TEST_SECRET", "store.password_env")
    monkeypatch.setenv("KVGATE_TEST_SECRET", "")
    with pytest.raises(MissingSecret, match="^--kv-remote-password-env: .* KVGATE_TEST_SECRET is empty"):
        secret_from_env("KVGATE_TEST_SECRET", "--kv-remote-password-env")
    assert issubclass(MissingSecret, ValueError)


def test_model_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KVGATE_MODEL_CACHE", str(tmp_path))
    assert model_cache_dir() == tmp_path
    monkeypatch.delenv("KVGATE_MODEL_CACHE")
    assert model_cache_dir() == Path.home() / ".cache" / "kvgate" / "models"


def test_offline_defaults_leave_an_operators_value() -> None:
    assert offline_defaults({}) == OFFLINE_DEFAULTS
    assert offline_defaults({"TOKENIZERS_PARALLELISM": "true"}) == {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
