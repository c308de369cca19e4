"""TextInputs on `tokenizers` alone (no transformers): what transformers' tokenizer call with
`padding=True, truncation=True, max_length=N` does, set once on the Rust tokenizer: truncation
longest-first at N (its truncation side), padding to the longest row (its pad token, pad side)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from kvgate.index.storage.tokenizer_files import load_tokenizer_files


class LightTextInputs:
    backend = "tokenizers"

    def __init__(self, directory: Path, max_length: int) -> None:
        files = load_tokenizer_files(directory)
        tok = files.tokenizer
        pad = files.special_tokens.get("pad_token")
        pad_id = tok.token_to_id(pad) if pad is not None else None
        if pad_id is None:
            raise ValueError(f"{directory}: its tokenizer has no pad token, and batches are padded")
        tok.enable_truncation(
            max_length=max_length,
            stride=0,
            strategy="longest_first",
            direction=files.config.get("truncation_side", "right"),
        )
        tok.enable_padding(
            direction=files.config.get("padding_side", "right"), pad_id=pad_id, pad_type_id=0, pad_token=pad
        )
        self._tok = tok
        self.max_length = max_length

    def __call__(self, texts: Sequence[str], pairs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        batch = list(texts) if pairs is None else list(zip(texts, pairs))
        encodings = self._tok.encode_batch(batch, add_special_tokens=True)
        return {
            "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
        }
