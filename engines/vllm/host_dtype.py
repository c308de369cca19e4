"""Which dtype vLLM's CPU build runs in on this host.

vLLM's CPU build runs a float32 checkpoint (SmolLM2's) in bfloat16 unless told otherwise. An x86
CPU computes bfloat16 natively only with AVX-512 BF16 or AMX; without them the engine's bfloat16
matrix products are converted in software, and a prefill takes several times as long as in float32
(docs/vllm.md has the figures). So kvgate's launcher asks for float32 on such a host and leaves
the engine's own choice everywhere else. Imports nothing of kvgate.
"""

from __future__ import annotations

from pathlib import Path

NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
CPUINFO = Path("/proc/cpuinfo")


def dtype_for(cpuinfo: str) -> str:
    """vLLM's `--dtype` for a host whose /proc/cpuinfo reads `cpuinfo`: "float32" on an x86 CPU
    without native bfloat16, else "auto" (the engine's choice).

    Invariant: "auto" whenever the text has no x86 `flags` line (another architecture, or no
    cpuinfo at all), so the launcher changes nothing where it cannot tell."""
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "flags":
            return "auto" if NATIVE_BF16_FLAGS & set(value.split()) else "float32"
    return "auto"


def host_dtype(path: Path = CPUINFO) -> str:
    """`dtype_for` this host's /proc/cpuinfo ("auto" when it cannot be read)."""
    try:
        return dtype_for(path.read_text(errors="replace"))
    except OSError:
        return "auto"
