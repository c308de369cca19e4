"""Cross-encoder verifier on ONNX Runtime: the MiniLM fine-tuned by `kvgate tune`.

Why a cross-encoder: both questions go through the transformer together, so attention can line up
"week" with "month" or "2016" with "2017", which two independent embeddings average away. One
forward pass over ≤ 5 short pairs costs a few ms on 2 cores, inside the lookup budget.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from kvgate.index.responses.text_inputs import load_text_inputs

_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class CrossEncoderVerifier:
    """Loads `model.onnx`, the tokenizer and `meta.json` from a directory made by `kvgate tune`."""

    def __init__(self, directory: str | Path, threads: int | None = None) -> None:
        import onnxruntime as ort

        directory = Path(directory)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads or min(2, os.cpu_count() or 1)
        opts.inter_op_num_threads = 1
        self._session = ort.InferenceSession(str(directory / "model.onnx"), opts, providers=["CPUExecutionProvider"])
        meta_file = directory / "meta.json"
        self.meta: dict[str, Any] = json.loads(meta_file.read_text()) if meta_file.exists() else {}
        self.max_length = int(self.meta.get("max_length", 96))
        self._tok = load_text_inputs(directory, self.max_length)
        self.directory = directory
        self.name = f"cross-encoder:{self.meta.get('fingerprint', directory.name)}"

    def score(self, pairs: Sequence[tuple[str, str]], batch_size: int = 64) -> np.ndarray:
        pairs = list(pairs)
        out = np.empty(len(pairs), dtype=np.float32)
        # similar lengths together: less padding per batch
        order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][0]) + len(pairs[i][1]))
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            enc = self._tok([pairs[i][0] for i in idx], [pairs[i][1] for i in idx])
            feed = {k: enc[k] for k in _INPUTS}
            out[idx] = self._session.run(None, feed)[0].reshape(-1)
        return out
