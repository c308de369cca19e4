"""kvgate: the one import name of the package.

The repository keeps its feature folders at the top (`middleware/`, `index/`, `engines/`, `tools/`);
an installed kvgate has them inside this package (`kvgate.middleware`, `kvgate.index`, ... :
`package_dir` in setup.py). In a checkout this folder holds symbolic links to them, so a checkout
on PYTHONPATH (as the benches run another commit's tree) and import-linter read the same shape.

The SDK's names (`from kvgate import Gateway`) resolve on first use (PEP 562), so `import kvgate`
loads neither LiteLLM nor the pipeline.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Gateway", "Stream", "AsyncStream", "CacheInfo", "cache_info"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'kvgate' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module("kvgate.middleware"), name)
