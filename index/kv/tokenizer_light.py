"""A model's chat tokenizer without transformers: `tokenizers` and jinja2, both in the core install.

The engines render and tokenize with transformers, so this repeats what transformers does with
the same files: the tokenizer dir loaded as it loads it (kvgate.index.storage.tokenizer_files),
the chat template found and rendered as it renders it (kv/chat_template.py), the rendered text
encoded without special tokens (`apply_chat_template(tokenize=True)`), a completions prompt with
them (vLLM's default for a raw prompt). tests/test_tokenizer_light.py holds it to transformers'
rendered text and ids.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from kvgate.index.kv.chat_template import (
    boundary_token,
    chat_messages,
    compile_template,
    find_chat_template,
    render_chat,
    split_segments,
)
from kvgate.index.kv.hashing import pack_tokens
from kvgate.index.storage.tokenizer_files import load_tokenizer_files


def encode_ids(rust: Any, text: str, add_special_tokens: bool) -> list[int]:
    """A fast tokenizer's (`tokenizers.Tokenizer`) ids for `text`, as its own `encode` gives them.

    Through `encode_batch_fast`, which lets other threads run while it works: `encode` holds the
    GIL for its whole call, so a long prompt hashed on a worker thread would stop the proxy's event
    loop (every other request's stream) for as long as it took (tests/test_tokenizer_gil.py,
    tools/bench/tokenizer_gil.py). The `_fast` call leaves out each token's character offsets,
    which nothing here reads and which cost a share of every call; the ids are the same."""
    return rust.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0].ids


# Tokens ending this close to where a lead's text was cut are dropped: a cut can change how the
# text just before it splits into words (a pre-tokenizer's regex looks ahead), never further back
# than the word it falls in.
LEAD_MARGIN_CHARS = 64


def lead_ids(rust: Any, text: str, chars: int) -> list[int]:
    """The ids of `text`'s first tokens, from tokenizing only its first `chars` characters: those
    ending at least LEAD_MARGIN_CHARS before the cut. For a tokenizer that splits text into words
    before its model runs (byte-level BPE, SentencePiece with a pre-tokenizer) they are the first
    ids of `encode_ids(rust, text, False)`; kvgate.index.kv.prompt checks that on every prompt it
    tokenizes whole later, and stops asking for leads if one ever differed.

    Invariant: [] when `text` is no longer than `chars` + LEAD_MARGIN_CHARS (nothing to save)."""
    if len(text) <= chars + LEAD_MARGIN_CHARS:
        return []
    encoding = rust.encode_batch([text[:chars]], add_special_tokens=False)[0]
    bound = chars - LEAD_MARGIN_CHARS
    ids: list[int] = []
    for token, (_, end) in zip(encoding.ids, encoding.offsets):
        if end > bound:
            break
        ids.append(token)
    return ids


def packed_lead(rust: Any, text: str, chars: int) -> bytes | None:
    """`lead_ids` packed (kvgate.index.kv.hashing.pack_tokens); None when there is no lead."""
    return pack_tokens(lead_ids(rust, text, chars)) or None


class LightChatTokenizer:
    backend = "tokenizers"

    def __init__(self, directory: str | Path, name: str) -> None:
        directory = Path(directory)
        files = load_tokenizer_files(directory)
        self.name = name
        self._rust = files.tokenizer
        self._special = files.special_tokens
        # a dir without a template still serves completions prompts: its chat requests fail as
        # transformers' would, when rendered
        source, self._no_template = find_chat_template(directory, files.config)
        self._template = compile_template(source) if source is not None else None
        self._boundary = boundary_token(files.all_special_tokens)

    def render(self, messages: Sequence[dict[str, Any]]) -> str:
        if self._template is None:
            raise ValueError(f"cannot render a chat: {self._no_template}")
        return render_chat(self._template, chat_messages(messages), self._special, add_generation_prompt=True)

    def segments(self, messages: Sequence[dict[str, Any]]) -> list[str]:
        return split_segments(self.render(messages), self._boundary)

    def encode(self, segment: str) -> list[int]:
        return encode_ids(self._rust, segment, False)

    def packed(self, segment: str) -> bytes:
        return pack_tokens(self.encode(segment))

    def packed_lead(self, segment: str, chars: int) -> bytes | None:
        return packed_lead(self._rust, segment, chars)

    @property
    def vocab_size(self) -> int | None:
        return self._rust.get_vocab_size(with_added_tokens=True)

    def packed_text(self, text: str) -> bytes:
        return pack_tokens(encode_ids(self._rust, text, True))

    def encode_messages(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        return self.encode(self.render(messages))
