"""The compiled cffi extension, with a message that names the real cause
when it cannot be loaded.

Two builds exist: ``dsopt._dsopt_wheel`` (``pip install .`` from the
repository's root: libdsopt and its MPI plugin inside this package, found
relative to the extension) and ``dsopt._dsopt_cffi`` (built in place, or by
``pip install bindings/python``, against a libdsopt built or installed
elsewhere, found through the extension's rpath). The wheel's is used when
present."""

from pathlib import Path

_HERE = Path(__file__).resolve().parent


def _load():
    try:
        from ._dsopt_wheel import ffi, lib
        return ffi, lib
    except ImportError as exc:
        if list(_HERE.glob("_dsopt_wheel*.so")):
            raise ImportError(
                f"dsopt: the extension of this installed package ({_HERE}) cannot be loaded; "
                f"its libdsopt.so should be next to it. Reinstall dsopt. Cause: {exc}") from exc
    try:
        from ._dsopt_cffi import ffi, lib
        return ffi, lib
    except ImportError as exc:
        built = sorted(_HERE.glob("_dsopt_cffi*.so"))
        if not built:
            raise ImportError(
                "dsopt: the cffi extension is not built: `pip install .` from the repository's "
                "root builds everything; or build libdsopt.so, then run "
                "`python3 bindings/python/dsopt/_ffi_build.py` (or `pip install bindings/python`)"
            ) from exc
        raise ImportError(
            f"dsopt: the cffi extension {built[0].name} is built but cannot be loaded, "
            "most likely because the libdsopt.so it was built against has moved or is gone "
            "(rebuild the extension against the library, or `pip install .` from the "
            f"repository's root for a self-contained package). Cause: {exc}") from exc


ffi, lib = _load()

__all__ = ["ffi", "lib"]
