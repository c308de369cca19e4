import sys, glob, os, shutil
from setuptools import setup, Extension
from Cython.Build import cythonize
mods = [l.strip() for l in open("cy_list.txt") if l.strip() and not l.startswith("#")]
exts = []
for path in mods:
    name = "kvgate." + path[:-3].replace("/", ".")
    exts.append(Extension(name, [path]))
sys.argv = ["x", "build_ext", "-b", "cybuild", "-t", "cytmp", "-j", "2"]
setup(packages=[], py_modules=[], ext_modules=cythonize(exts, compiler_directives={"language_level": 3, "annotation_typing": False, "binding": True}, nthreads=2, quiet=True))
for so in glob.glob("cybuild/kvgate/**/*.so", recursive=True):
    rel = os.path.relpath(so, "cybuild/kvgate")
    shutil.copy(so, rel)
    print("placed", rel)
