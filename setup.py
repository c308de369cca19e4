"""The package list of the one import name `kvgate` (everything else is in pyproject.toml), and
its two optional C extensions.

The feature folders at the top of the repository are kvgate's subpackages: `middleware/` installs
as `kvgate.middleware`, `index/` as `kvgate.index`, and so on. setuptools' declarative `packages.find`
cannot put a prefix on the names it finds, hence this file.

`kvgate.index.kv._prefix_loops` is the prefix index's per-block loops in C (index/kv/prefix_loops.py
has them in Python, and says which runs). It is built where a C compiler is found; `optional=True`
lets an install without one finish with the Python loops, which give the same results. An editable
install builds it in place: after changing the C file, install again (`make install`).

`kvgate.index.kv._hash_loops` is the prompt hasher's SHA-256 loops in C over OpenSSL's libcrypto
(index/kv/hash_loops.py has them in Python); it also needs OpenSSL's headers (Debian: libssl-dev),
and is optional the same way.

`kvgate.middleware.forward._sse_take` reads a relayed chat stream's usual events in C
(middleware/forward/sse_take.py has them in Python); optional the same way.
"""

from setuptools import Extension, find_packages, setup

FOLDERS = ("middleware", "index", "engines", "tools")

setup(
    packages=["kvgate"] + [f"kvgate.{name}" for name in find_packages(include=[f"{f}*" for f in FOLDERS])],
    package_dir={"kvgate": "kvgate", **{f"kvgate.{f}": f for f in FOLDERS}},
    ext_modules=[
        Extension(
            "kvgate.index.kv._prefix_loops",
            ["index/kv/_prefix_loops.c", "index/kv/_native_loops.c", "index/kv/_u64_tables.c"],
            depends=["index/kv/_u64_tables.h"],
            optional=True,
        ),
        Extension("kvgate.index.kv._hash_loops", ["index/kv/_hash_loops.c"], libraries=["crypto"], optional=True),
        Extension("kvgate.middleware.forward._sse_take", ["middleware/forward/_sse_take.c"], optional=True),
    ],
)
