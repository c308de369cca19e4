"""The package list of the one import name `kvgate` (everything else is in pyproject.toml).

The feature folders at the top of the repository are kvgate's subpackages: `middleware/` installs
as `kvgate.middleware`, `index/` as `kvgate.index`, and so on. setuptools' declarative `packages.find`
cannot put a prefix on the names it finds, hence this file.
"""

from setuptools import find_packages, setup

FOLDERS = ("middleware", "index", "engines", "tools")

setup(
    packages=["kvgate"] + [f"kvgate.{name}" for name in find_packages(include=[f"{f}*" for f in FOLDERS])],
    package_dir={"kvgate": "kvgate", **{f"kvgate.{f}": f for f in FOLDERS}},
)
