"""Builds the cffi extension ``dsopt._dsopt_cffi`` (out-of-line API mode).

The declarations are produced from ``include/dsopt.h`` itself by running the C
preprocessor, so they cannot drift from the header; the ``DSOPT_*`` integer
macros are declared as ``#define NAME ...`` so the C compiler fills them in.
The callbacks of ``dsopt.Communicator.from_callbacks`` are added as
``extern "Python"`` functions (``CALLBACKS``).

Where things are found:

* header: ``$DSOPT_INCLUDE_DIR``, else ``<repo>/include``, else the
  ``includedir`` of an installed dsopt (``pkg-config dsopt``);
* library: ``$DSOPT_LIBRARY_DIR``, else ``<repo>/build`` when it holds
  ``libdsopt.so``, else the ``libdir`` of an installed dsopt (pkg-config),
  else the system loader path. A directory that is used is also recorded as
  the extension's run-time search path (rpath).

Build in place (the extension lands next to this file)::

    python3 bindings/python/dsopt/_ffi_build.py

``pip install bindings/python`` runs the same ``ffi`` through setuptools.
``python3 _ffi_build.py --emit-c FILE`` writes the C source of the wheel's
extension, ``dsopt._dsopt_wheel`` (the same declarations; the wheel's CMake
build, bindings/python/CMakeLists.txt, compiles it).
"""

import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from cffi import FFI

PACKAGE_DIR = Path(__file__).resolve().parent
BINDING_ROOT = PACKAGE_DIR.parent
REPO_ROOT = BINDING_ROOT.parent.parent

# Everything the preprocessor prints after this declaration comes from
# dsopt.h; what comes before it is the system headers' contribution.
_MARKER = "typedef int dsopt_cdef_begins_here;"


def _pkg_config_dir(variable: str):
    """A directory variable of dsopt.pc (an installed dsopt), or None."""
    cmd = [os.environ.get("PKG_CONFIG", "pkg-config"), f"--variable={variable}", "dsopt"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return Path(out).resolve() if out else None


def include_dir() -> Path:
    explicit = os.environ.get("DSOPT_INCLUDE_DIR")
    if explicit:
        return Path(explicit).resolve()
    in_tree = REPO_ROOT / "include"
    if (in_tree / "dsopt.h").exists():
        return in_tree.resolve()
    return _pkg_config_dir("includedir") or in_tree


def library_dir():
    """The directory holding libdsopt.so, or None for the system loader path."""
    explicit = os.environ.get("DSOPT_LIBRARY_DIR")
    if explicit:
        return Path(explicit).resolve()
    in_tree = REPO_ROOT / "build"
    if (in_tree / "libdsopt.so").exists():
        return in_tree.resolve()
    return _pkg_config_dir("libdir")


def _preprocessor() -> list:
    return shlex.split(os.environ.get("CC", "cc")) + ["-E", "-P", "-DDSOPT_API="]


def _run_preprocessor(source: str, extra_args: list) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "dsopt_cdef.c"
        src.write_text(source)
        cmd = _preprocessor() + ["-I", str(include_dir())] + extra_args + [str(src)]
        return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def declarations() -> str:
    """The header's declarations, preprocessed, without the system headers'."""
    text = _run_preprocessor(
        "#include <stddef.h>\n#include <stdint.h>\n" + _MARKER + "\n#include \"dsopt.h\"\n", []
    )
    head, sep, body = text.partition(_MARKER)
    if not sep:
        raise RuntimeError("preprocessed dsopt.h lacks the cdef marker")
    return body.strip() + "\n"


def integer_macros() -> str:
    """``#define NAME ...`` for every DSOPT_* macro whose value is an integer."""
    text = _run_preprocessor('#include "dsopt.h"\n', ["-dM"])
    names = re.findall(r"^#define (DSOPT_\w+) \(?-?\d+[uUlL]*\)?\s*$", text, re.MULTILINE)
    return "".join(f"#define {name} ...\n" for name in sorted(names))


# The Python functions behind dsopt_comm_ops (communicator.py defines them
# with ffi.def_extern); ``user`` is the ffi.new_handle of the Python
# communicator state.
CALLBACKS = """
extern "Python" int _dsopt_py_allreduce(const void *, void *, size_t, int32_t, int32_t, int32_t,
                                        void *);
extern "Python" int _dsopt_py_reduce_scatter(const void *, void *, size_t, int32_t, int32_t,
                                             int32_t, void *);
extern "Python" int _dsopt_py_allgather(const void *, void *, size_t, int32_t, int32_t, void *);
extern "Python" int _dsopt_py_alltoall(const void *, void *, size_t, int32_t, int32_t, void *);
extern "Python" const char *_dsopt_py_error_message(int, void *);
extern "Python" void _dsopt_py_release(void *);
"""


def make_ffi(module: str = "dsopt._dsopt_cffi") -> FFI:
    ffi = FFI()
    ffi.cdef(declarations() + integer_macros() + CALLBACKS)
    libdir = library_dir()
    link = {}
    if libdir is not None:
        link = {"library_dirs": [str(libdir)], "extra_link_args": [f"-Wl,-rpath,{libdir}"]}
    ffi.set_source(
        module,
        '#include "dsopt.h"',
        include_dirs=[str(include_dir())],
        libraries=["dsopt"],
        **link,
    )
    return ffi


ffi = make_ffi()


def build_in_place() -> Path:
    """Compiles the extension into bindings/python/dsopt/ and returns its path."""
    with tempfile.TemporaryDirectory() as tmp:
        built = Path(ffi.compile(tmpdir=tmp, verbose=False))
        target = PACKAGE_DIR / built.name
        target.write_bytes(built.read_bytes())
    return target


if __name__ == "__main__":
    if sys.argv[1:2] == ["--emit-c"]:  # the wheel's CMake build compiles it itself
        make_ffi("dsopt._dsopt_wheel").emit_c_code(sys.argv[2])
        sys.exit(0)
    where = library_dir()
    print(f"dsopt: header {include_dir() / 'dsopt.h'}", file=sys.stderr)
    print(f"dsopt: libdsopt.so from {where if where else 'the system loader path'}", file=sys.stderr)
    print(build_in_place())
