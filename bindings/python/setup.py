"""pip install bindings/python

Needs libdsopt.so: from $DSOPT_LIBRARY_DIR, else <repo>/build, else an
installed dsopt found by pkg-config, else the system loader path (see
dsopt/_ffi_build.py)."""

from setuptools import setup
from setuptools.command.build_ext import build_ext


class build_ext_always(build_ext):
    """Recompiles the extension on every build: where libdsopt.so is found
    (the extension's rpath) can change without any source file changing."""

    def finalize_options(self):
        self.force = True  # (Command.__init__ resets it after initialize_options)
        super().finalize_options()


setup(
    name="dsopt",
    version="0.1.0",
    description="Python binding (cffi) of the dsopt optimizer library",
    packages=["dsopt", "dsopt.torch", "dsopt.torch.fsdp"],
    python_requires=">=3.8",
    install_requires=["cffi>=1.15", "numpy"],
    cffi_modules=["dsopt/_ffi_build.py:ffi"],
    cmdclass={"build_ext": build_ext_always},
    zip_safe=False,
)
