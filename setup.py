"""The package list of the one import name `kvgate` (everything else is in pyproject.toml), and
its one optional C extension.

The feature folders at the top of the repository are kvgate's subpackages: `middleware/` installs
as `kvgate.middleware`, `index/` as `kvgate.index`, and so on. setuptools' declarative `packages.find`
cannot put a prefix on the names it finds, hence this file.

`kvgate.index.kv._prefix_loops` is the prefix index's per-block loops in C (index/kv/prefix_loops.py
has them in Python, and says which runs). It is built where a C compiler is found; `optional=True`
lets an install without one finish with the Python loops, which give the same results. An editable
install builds it in place: after changing the C file, install again (`make install`).
"""

from setuptools import Extension, find_packages, setup

FOLDERS = ("middleware", "index", "engines", "tools")

setup(
    packages=["kvgate"] + [f"kvgate.{name}" for name in find_packages(include=[f"{f}*" for f in FOLDERS])],
    package_dir={"kvgate": "kvgate", **{f"kvgate.{f}": f for f in FOLDERS}},
    ext_modules=[Extension("kvgate.index.kv._prefix_loops", ["index/kv/_prefix_loops.c"], optional=True)],
)
