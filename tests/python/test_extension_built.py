"""The binding is built and loads the library it was compiled against."""

import pytest

import conftest


def test_extension_imports_and_matches_header_version():
    if conftest.DSOPT_IMPORT_ERROR:
        pytest.skip(conftest.DSOPT_IMPORT_ERROR)
    import dsopt

    major, minor, patch = dsopt.HEADER_VERSION
    assert dsopt.version() == f"{major}.{minor}.{patch}"
    assert "simd=" in dsopt.build_info()
