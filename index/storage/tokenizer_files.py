"""A model dir's tokenizer as transformers loads it, on `tokenizers` alone.

transformers is not in the core install, yet both sides of index read tokenizer dirs: the KV side
renders and tokenizes prompts as the engines do (kv/tokenizer_light.py), the response store feeds
its ONNX models (responses/text_inputs_light.py). Where transformers is installed they use it (the
engines tokenize with it); where it is not, this loads the same files and repeats what transformers
(5.x, vLLM's) does on load that changes token ids:

- The named special tokens (bos, eos, unk, sep, pad, cls, mask, then any other `*_token` string
  of `tokenizer_config.json`), each a string or a dict with "content". A legacy
  `special_tokens_map.json` overrides them where the config lists no `added_tokens_decoder`;
  `additional_special_tokens` / `extra_special_tokens` are the extra ones.
- Each of those the tokenizer does not hold as an added token is added, special: it is then
  matched whole before the model splits the text around it.
- `add_bos_token` / `add_eos_token` are not read: with a `tokenizer.json` present transformers
  drops them too, and the file's post-processor says what `add_special_tokens=True` adds.
- The truncation and padding stored in the file are cleared: transformers resets both on every
  call that does not ask for them, and a caller that does sets its own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NAMED_SPECIAL = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
LEGACY_SPECIAL_FILE = "special_tokens_map.json"


def have_transformers() -> bool:
    """Whether transformers imports (imported here, on the caller's thread: its lazy imports are
    not safe when two threads reach them first at once; a later call finds it in sys.modules)."""
    try:
        from transformers import AutoTokenizer  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass(frozen=True)
class TokenizerFiles:
    tokenizer: Any  # tokenizers.Tokenizer, special tokens added, no truncation or padding
    config: dict[str, Any]  # tokenizer_config.json as read
    special_tokens: dict[str, str]  # named: what a chat template sees (bos_token, eos_token, ...)
    extra_special_tokens: tuple[str, ...]

    @property
    def all_special_tokens(self) -> list[str]:
        """Named then extra, each once: transformers' `all_special_tokens`, in its order."""
        return list(dict.fromkeys([*self.special_tokens.values(), *self.extra_special_tokens]))


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _content(token: Any) -> str | None:
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else None


def _added(token: Any) -> Any:
    """A special token as transformers adds it: its dict's flags kept, special either way."""
    from tokenizers import AddedToken

    if isinstance(token, dict):
        flags = {k: token[k] for k in ("single_word", "lstrip", "rstrip", "normalized") if k in token}
        return AddedToken(token["content"], **flags, special=True)
    return AddedToken(token, special=True)


def load_tokenizer_files(directory: str | Path) -> TokenizerFiles:
    from tokenizers import Tokenizer

    directory = Path(directory)
    if not (directory / TOKENIZER_FILE).is_file():
        raise FileNotFoundError(
            f"{directory} has no {TOKENIZER_FILE} (without transformers, a tokenizer dir needs one)"
        )
    tokenizer = Tokenizer.from_file(str(directory / TOKENIZER_FILE))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    config = _read_json(directory / CONFIG_FILE)
    raw = dict(config)
    if "added_tokens_decoder" not in config:
        raw.update(_read_json(directory / LEGACY_SPECIAL_FILE))
    named: dict[str, Any] = {k: raw[k] for k in NAMED_SPECIAL if _content(raw.get(k)) is not None}
    named.update(
        (k, v) for k, v in raw.items() if k.endswith("_token") and k not in NAMED_SPECIAL and _content(v) is not None
    )
    extras = raw.get("extra_special_tokens") or raw.get("additional_special_tokens") or []
    if isinstance(extras, dict):  # named model-specific tokens (e.g. an image token)
        named.update((k, v) for k, v in extras.items() if _content(v) is not None)
        extras = []
    extras = [t for t in extras if _content(t) is not None]
    seen = {t.content for t in tokenizer.get_added_tokens_decoder().values()}
    missing = []
    for token in [*named.values(), *extras]:
        if _content(token) not in seen:
            seen.add(_content(token))
            missing.append(_added(token))
    if missing:
        tokenizer.add_tokens(missing)
    return TokenizerFiles(
        tokenizer, config, {k: str(_content(v)) for k, v in named.items()}, tuple(str(_content(t)) for t in extras)
    )
