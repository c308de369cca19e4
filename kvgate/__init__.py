"""kvgate: the one import name of the package.

The repository keeps its feature folders at the top (`middleware/`, `index/`, `engines/`, `tools/`);
an installed kvgate has them inside this package (`kvgate.middleware`, `kvgate.index`, ... :
`package_dir` in setup.py). In a checkout used without installing (PYTHONPATH pointing at it, as
the benches do to run another commit's tree) the folders are found beside this one instead, so the
tree that was named is the tree that runs.

The SDK's names (`from kvgate import Gateway`) resolve on first use (PEP 562), so `import kvgate`
loads neither LiteLLM nor the pipeline.
"""

from __future__ import annotations

from pathlib import Path as _Path
from typing import Any

_here = _Path(__file__).resolve().parent
if not (_here / "middleware").is_dir() and (_here.parent / "middleware" / "__init__.py").is_file():
    __path__.append(str(_here.parent))  # noqa: F821 (a package's own __path__)
del _Path, _here

__all__ = ["Gateway", "Stream", "AsyncStream", "CacheInfo", "cache_info"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'kvgate' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module("kvgate.middleware"), name)
