"""pip install bindings/python

Needs libdsopt.so: from $DSOPT_LIBRARY_DIR, else <repo>/build, else the
system loader path (see dsopt/_ffi_build.py)."""

from setuptools import setup

setup(
    name="dsopt",
    version="0.1.0",
    description="Python binding (cffi) of the dsopt optimizer library",
    packages=["dsopt"],
    python_requires=">=3.8",
    install_requires=["cffi>=1.15", "numpy"],
    cffi_modules=["dsopt/_ffi_build.py:ffi"],
    zip_safe=False,
)
