"""What makes stored KV reusable, as the key namespace; and the vLLM versions the connector runs in.

Two engines may load each other's chunks only when every input of the KV tensors' bytes agrees:
the model's weights (a hub name and revision, or for a local directory a digest of its config and
of each weight file's name, size and first and last MiB), the KV
dtype, the block size, the attention layout as vLLM sizes it (layers, KV heads per rank, head
size), the parallel shape and this worker's rank, and the device kind (CPU and CUDA builds lay
blocks out differently). The engine's own block hash already carries the token prefix, LoRA and
`cache_salt` (so one tenant's KV never serves another), and chunk keys are that hash. A chunk
whose stored shapes still disagree with the engine's blocks is refused at load time
(worker.py), as a second line.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

SUPPORTED = ("0.32",)  # vLLM minor versions whose connector API this was built and tested against


class UnsupportedVllm(RuntimeError):
    pass


def check_version(version: str) -> None:
    """Stop with a clear message outside the supported range."""
    if not any(version == v or version.startswith(v + ".") for v in SUPPORTED):
        raise UnsupportedVllm(
            f"kvgate's KV connector supports vLLM {', '.join(v + '.x' for v in SUPPORTED)}; this engine runs "
            f"vLLM {version}. Install a supported vLLM, or remove --kv-transfer-config to run without kvgate's tier."
        )


SAMPLE = 1 << 20  # bytes read from each end of every weight file


def model_identity(model: str, revision: str | None) -> str:
    """A hub model as name@revision; a local directory as a digest of config.json and, per weight
    file, its name, size and first and last MiB (fine-tunes of one base share config and sizes,
    not bytes; 2 MiB per file keeps this cheap)."""
    path = Path(model)
    if not path.is_dir():
        return f"{model}@{revision or 'main'}"
    h = hashlib.sha256()
    cfg = path / "config.json"
    if cfg.exists():
        h.update(cfg.read_bytes())
    for f in sorted(path.iterdir()):
        if f.suffix in (".safetensors", ".bin", ".pt", ".gguf"):
            size = f.stat().st_size
            h.update(f"{f.name}:{size}".encode())
            with open(f, "rb") as fh:
                h.update(fh.read(SAMPLE))
                fh.seek(max(0, size - SAMPLE))
                h.update(fh.read(SAMPLE))
    return f"{path.name}#{h.hexdigest()[:16]}"


def namespace(parts: dict[str, Any], rank: int) -> str:
    """The key namespace: readable model name, a digest of every part, and the rank."""
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]
    name = str(parts.get("model", "model")).split("#", 1)[0].split("@", 1)[0].replace(os.sep, "_")[-40:]
    return f"{name}:{digest}:r{rank}"


def vllm_parts(vllm_config: Any, device: str) -> dict[str, Any]:
    """The namespace's parts from a VllmConfig (same on the scheduler's and the workers' side)."""
    mc, cc, pc = vllm_config.model_config, vllm_config.cache_config, vllm_config.parallel_config
    kv_dtype = cc.cache_dtype if cc.cache_dtype not in (None, "auto") else str(mc.dtype).replace("torch.", "")
    return {
        "model": model_identity(mc.model, getattr(mc, "revision", None)),
        "kv_dtype": kv_dtype,
        "block_size": cc.block_size,
        "layers": mc.get_num_layers(pc),
        "kv_heads": mc.get_num_kv_heads(pc),
        "head_size": mc.get_head_size(),
        "tp": pc.tensor_parallel_size,
        "pp": pc.pipeline_parallel_size,
        "device": device,
    }
