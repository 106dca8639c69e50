"""The compiled cffi extension, with a clear message when it is missing."""

try:
    from ._dsopt_cffi import ffi, lib
except ImportError as exc:  # pragma: no cover - depends on the build
    raise ImportError(
        "dsopt: the cffi extension dsopt._dsopt_cffi is not built; build "
        "libdsopt.so, then run `python3 bindings/python/dsopt/_ffi_build.py` "
        "(or `pip install bindings/python`). Cause: " + str(exc)
    ) from exc

__all__ = ["ffi", "lib"]
