"""Runs pytest on the files given, for ctest (tests/CMakeLists.txt).

Exits 77 (ctest's skip code for these tests) with the reason when pytest or numpy is missing for
this interpreter, so a machine without Debian's python3-pytest or python3-numpy reports the tests
skipped rather than failed. The module itself is imported by the tests: a build that produced a
broken module fails them.
"""
import sys

try:
    import pytest
except ImportError as e:
    print(f"skipped: pytest is not installed for {sys.executable} (Debian: python3-pytest): {e}")
    sys.exit(77)
try:
    import numpy  # noqa: F401  (the module's arrays need it)
except ImportError as e:
    print(f"skipped: numpy is not installed for {sys.executable} (Debian: python3-numpy): {e}")
    sys.exit(77)

# -p no:cacheprovider: nothing is written into the source tree.
sys.exit(pytest.main(["-q", "-rs", "-p", "no:cacheprovider", *sys.argv[1:]]))
