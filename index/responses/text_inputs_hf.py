"""TextInputs on transformers' tokenizer (where transformers is installed)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np


class HFTextInputs:
    backend = "transformers"

    def __init__(self, directory: Path, max_length: int) -> None:
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
        self.max_length = max_length

    def __call__(self, texts: Sequence[str], pairs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        enc = self._tok(
            list(texts),
            list(pairs) if pairs is not None else None,
            return_tensors="np",
            padding=True,
            truncation=True,
            max_length=self.max_length,
            return_token_type_ids=True,
        )
        return {k: np.asarray(enc[k], dtype=np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")}
