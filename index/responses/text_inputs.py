"""TextInputs: texts (or pairs of texts) → the arrays an exported encoder runs on, and the factory.

The ONNX embedder and the verifier tokenize with their model dir's tokenizer: with transformers
where it is installed (what the models were exported and tuned with), else the same files on
`tokenizers` (text_inputs_light.py, in the core install), which gives the same ids and masks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from kvgate.index.storage.tokenizer_files import have_transformers


@runtime_checkable
class TextInputs(Protocol):
    backend: str  # "transformers" | "tokenizers"

    def __call__(self, texts: Sequence[str], pairs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """int64 `input_ids`, `attention_mask` and `token_type_ids`, one row per text (with its
        pair's text after it), the model's special tokens added, cut at the max length and padded
        to the longest row."""
        ...


def load_text_inputs(directory: str | Path, max_length: int) -> TextInputs:
    if have_transformers():
        from kvgate.index.responses.text_inputs_hf import HFTextInputs

        return HFTextInputs(Path(directory), max_length)
    from kvgate.index.responses.text_inputs_light import LightTextInputs

    return LightTextInputs(Path(directory), max_length)
