"""What kvgate takes from the process environment, one rule each: where models are cached, the
secret a setting names by variable (never by value), and the defaults every kvgate process gives
the Hugging Face libraries.

Nothing here sets a variable: the environment belongs to the process's owner, so only an entry
point (middleware/cli.py, an engine's `python -m` block) applies `offline_defaults`, before it
imports a library that reads them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

MODEL_CACHE_ENV = "KVGATE_MODEL_CACHE"

OFFLINE_DEFAULTS = {
    # kvgate loads only local or packaged weights: the Hugging Face libraries never reach for the
    # hub (library code passes local_files_only too; this also covers what it does not call itself)
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    # the tokenizers' own thread pool does not survive a fork (the proxy's workers, the benches'
    # servers); kvgate tokenizes one prompt per call, in its own threads
    "TOKENIZERS_PARALLELISM": "false",
}


class MissingSecret(ValueError):
    """A setting names an environment variable for a secret, and that variable is unset or empty.
    The message names the setting and the variable."""


def model_cache_dir() -> Path:
    """Where converted and exported models live, shared by every kvgate of the user:
    $KVGATE_MODEL_CACHE, else ~/.cache/kvgate/models."""
    return Path(os.environ.get(MODEL_CACHE_ENV) or Path.home() / ".cache" / "kvgate" / "models")


def secret_from_env(variable: str | None, setting: str) -> str | None:
    """The secret held by the environment variable `variable`, which the config field or flag
    `setting` names (e.g. "store.password_env"); None when no variable is named. A named variable
    that is unset or empty raises MissingSecret: the operator asked for a secret, and going on
    without one would fail later and further from the cause (Redis refusing the connection) or
    quietly weaken it (an empty salt key)."""
    if not variable:
        return None
    value = os.environ.get(variable)
    if not value:
        state = "not set" if value is None else "empty"
        raise MissingSecret(f"{setting}: the environment variable {variable} is {state} in this process's environment")
    return value


def offline_defaults(environ: Mapping[str, str]) -> dict[str, str]:
    """The OFFLINE_DEFAULTS that `environ` does not set yet (an operator's own value wins), for an
    entry point to add to its own environment."""
    return {name: value for name, value in OFFLINE_DEFAULTS.items() if name not in environ}
