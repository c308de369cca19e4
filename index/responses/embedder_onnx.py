"""Embedder on ONNX Runtime: the same MiniLM weights, exported once from the local model.

Why: the semantic hit path is dominated by that single embedding of the query, and on a small CPU
ONNX Runtime runs MiniLM's forward several times faster than torch does. The export is a plain trace of the
sentence-transformers computation (BERT → mean pooling over the attention mask → L2 normalise),
so both embedders give the same vectors (tested to 1e-5).

Exporting needs torch, which the core install does not have (it is the `embedder` extra's). A model
dir that already holds its export (`model.onnx`, written by `kvgate prepare --onnx-dir` where torch
is) runs without it: the proxy then needs only ONNX Runtime and the tokenizer files beside it,
which it reads with transformers where that is installed, else with `tokenizers` (text_inputs.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from kvgate.index.responses.embedder_model import (
    EMBEDDER_EXTRA,
    EXPORTED_ONNX,
    MANIFEST,
    EmbedderMissing,
    model_identity,
    read_manifest,
)
from kvgate.index.responses.text_inputs import load_text_inputs
from kvgate.index.storage.env import model_cache_dir

log = logging.getLogger("kvgate.embedder")

_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
MAX_TOKENS = (
    256  # all-MiniLM-L6-v2 was trained with max_seq_length 256 (a model dir's sentence_bert_config.json overrides)
)


def _fingerprint(model_path: Path) -> str:
    """Name the export after the weights it came from, so a new model never reuses an old export."""
    weights = model_path / "model.safetensors"
    stat = weights.stat() if weights.exists() else model_path.stat()
    return hashlib.sha256(f"{model_path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]


def _model_facts(model_path: Path) -> tuple[str, int]:
    """(export file prefix, max tokens) of a sentence-transformers model dir: "mpnet" for MPNet,
    "minilm" otherwise (the name earlier exports of MiniLM have); max_seq_length from its config."""
    try:
        kind = json.loads((model_path / "config.json").read_text()).get("model_type", "")
    except (OSError, ValueError):
        kind = ""
    try:
        limit = int(json.loads((model_path / "sentence_bert_config.json").read_text())["max_seq_length"])
    except (OSError, ValueError, KeyError, TypeError):
        limit = MAX_TOKENS
    return ("mpnet" if kind == "mpnet" else "minilm"), limit


def export_onnx(model_path: Path, target: Path) -> Path:
    """Trace the model with torch and write `target` atomically (tmp file + rename)."""
    try:
        import torch
    except ModuleNotFoundError:
        raise no_exporter(model_path) from None
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_path), local_files_only=True)
    model = AutoModel.from_pretrained(str(model_path), attn_implementation="eager", local_files_only=True).eval()

    class _Pooled(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, *rest):  # type: ignore[no-untyped-def]
            extra = {"token_type_ids": rest[0]} if rest else {}  # MPNet has no token types
            hidden = self.inner(input_ids=input_ids, attention_mask=attention_mask, **extra).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, dim=-1)

    sample = tok(["a sample sentence for tracing", "short"], return_tensors="pt", padding=True)
    inputs = [k for k in _INPUTS if k in sample]
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(f".tmp{os.getpid()}")
    dynamic = {k: {0: "batch", 1: "tokens"} for k in inputs} | {"embedding": {0: "batch"}}
    wrapper = _Pooled(model).eval()
    with torch.no_grad():
        torch.onnx.export(
            wrapper,
            tuple(sample[k] for k in inputs),
            str(tmp),
            input_names=inputs,
            output_names=["embedding"],
            dynamic_axes=dynamic,
            opset_version=17,
            dynamo=False,
        )
    os.replace(tmp, target)
    return target


def no_exporter(model_path: Path) -> EmbedderMissing:
    """A model dir without its ONNX export, where torch (which exports it) is not installed."""
    return EmbedderMissing(f"{model_path.name} has no ONNX export yet, and exporting it needs torch ({EMBEDDER_EXTRA})")


def onnx_file_of(model_path: Path, cache_dir: str | Path | None = None) -> Path:
    """The ONNX file a model dir runs as: its own export (an exported dir), else the one exported
    once into the model cache (which may not exist yet)."""
    exported = model_path / EXPORTED_ONNX
    if exported.exists():
        return exported
    prefix, _ = _model_facts(model_path)
    return (Path(cache_dir) if cache_dir else model_cache_dir()) / f"{prefix}-{_fingerprint(model_path)}.onnx"


def export_onnx_dir(model_path: Path, target: Path) -> Path:
    """A model dir that runs without torch: `model_path`'s files but its weights, its ONNX export
    as `model.onnx`, and a manifest naming the vectors it makes as `model_path`'s (a cache filled
    by either is the other's). Written beside `target` and renamed into place."""
    import shutil
    import tempfile

    model_path, target = Path(model_path), Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}-") as tmp:
        staged = Path(tmp) / "model"
        shutil.copytree(model_path, staged, ignore=shutil.ignore_patterns("*.safetensors", "*.bin", "*.onnx", "*.pt"))
        export_onnx(model_path, staged / EXPORTED_ONNX)
        manifest = {**(read_manifest(model_path) or {}), "identity": model_identity(model_path)}
        (staged / MANIFEST).write_text(json.dumps(manifest, indent=2))
        if target.exists():
            shutil.rmtree(target)
        staged.rename(target)
    return target


class OnnxEmbedder:
    """MiniLM on ONNX Runtime; exports the ONNX file on first use if it is missing."""

    def __init__(self, model_path: Path, cache_dir: str | Path | None = None, threads: int | None = None) -> None:
        import onnxruntime as ort

        model_path = Path(model_path)
        _, self.max_tokens = _model_facts(model_path)
        onnx_file = onnx_file_of(model_path, cache_dir)
        if not onnx_file.exists():
            log.warning("exporting %s to ONNX at %s (once)", model_path.name, onnx_file)
            export_onnx(model_path, onnx_file)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads or min(4, os.cpu_count() or 1)
        opts.inter_op_num_threads = 1
        # No spin-waiting between runs: the proxy embeds one short question per request, and idle
        # intra-op threads spinning for the next one take the cores the event loop needs, which
        # slows every semantic hit on a busy machine.
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self._session = ort.InferenceSession(str(onnx_file), opts, providers=["CPUExecutionProvider"])
        self._tok = load_text_inputs(model_path, self.max_tokens)
        self.model_path = model_path
        self.name = f"onnx:{model_path.name}"
        self.identity = model_identity(model_path)
        shape = self._session.get_outputs()[0].shape
        if len(shape) != 2:  # e.g. a bare transformer's export (per-token states): its vectors would be wrong
            raise ValueError(
                f"{onnx_file}: not an embedder kvgate can run (its output is {shape}, not "
                "[batch, dim]); write one with `kvgate prepare --onnx-dir DIR`"
            )
        self.dim = int(shape[-1] or 384)
        self._inputs = [i.name for i in self._session.get_inputs()]
        self.path = onnx_file

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        out = []
        # Batches of similar length waste less padding; 64 keeps memory flat.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for start in range(0, len(order), 64):
            idx = order[start : start + 64]
            enc = self._tok([texts[i] for i in idx])
            feed = {k: enc[k] for k in self._inputs}
            out.append((idx, self._session.run(None, feed)[0]))
        result = np.empty((len(texts), self.dim), dtype=np.float32)
        for idx, rows in out:
            result[idx] = rows
        return result
