"""Which of a pair of twin modules runs: a C extension, or the Python module with the same
names and contracts that stands in where the extension was not built (setup.py builds them
optionally).

May import: the standard library only.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType


def twin(native: str, python: str) -> ModuleType:
    """The module `native` when it imports, else the (already imported) module `python`."""
    try:
        return importlib.import_module(native)
    except ImportError:
        return sys.modules[python]
