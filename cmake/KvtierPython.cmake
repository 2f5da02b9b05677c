# Decides whether the Python package `kvtier` (python/, pybind11) is built. KVTIER_PYTHON=AUTO
# builds it when pybind11's CMake config and a Python interpreter with its headers are found;
# ON requires them; OFF never looks. Sets KVTIER_HAVE_PYTHON, and KVTIER_PYTHON_WHY_NOT (the
# reason, for the configure log and for the skipped ctest entry) when it is OFF.
#
# The interpreter: Debian's pybind11, numpy, torch and pytest packages serve Debian's own
# /usr/bin/python3, and another python3 (pyenv) may come first on PATH without them, so
# /usr/bin/python3 is the default when Python3_EXECUTABLE is not given.
#
# A sanitized build (KVTIER_SANITIZE) builds no module: an ASan or TSan extension cannot be
# loaded into an uninstrumented interpreter, so the asan, tsan and fuzz presets leave it out.
set(KVTIER_HAVE_PYTHON OFF)
set(KVTIER_PYTHON_WHY_NOT "")
if(KVTIER_PYTHON STREQUAL "OFF")
  set(KVTIER_PYTHON_WHY_NOT "KVTIER_PYTHON=OFF")
elseif(KVTIER_SANITIZE)
  set(KVTIER_PYTHON_WHY_NOT
      "a sanitized build (KVTIER_SANITIZE=${KVTIER_SANITIZE}) cannot load into an uninstrumented interpreter")
  if(KVTIER_PYTHON STREQUAL "ON")
    message(FATAL_ERROR "KVTIER_PYTHON=ON: ${KVTIER_PYTHON_WHY_NOT}")
  endif()
else()
  if(NOT DEFINED Python3_EXECUTABLE AND EXISTS /usr/bin/python3)
    set(Python3_EXECUTABLE /usr/bin/python3 CACHE FILEPATH
        "The Python interpreter the kvtier module is built for (Debian's, by default)")
  endif()
  find_package(Python3 COMPONENTS Interpreter Development.Module)
  if(NOT Python3_FOUND)
    set(KVTIER_PYTHON_WHY_NOT
        "no Python 3 interpreter with its headers (Debian: python3-dev) was found")
  else()
    find_package(pybind11 2.6 CONFIG QUIET)
    if(NOT pybind11_FOUND)
      set(KVTIER_PYTHON_WHY_NOT
          "pybind11's CMake config was not found (Debian: pybind11-dev python3-pybind11)")
    else()
      set(KVTIER_HAVE_PYTHON ON)
    endif()
  endif()
  if(KVTIER_PYTHON STREQUAL "ON" AND NOT KVTIER_HAVE_PYTHON)
    message(FATAL_ERROR "KVTIER_PYTHON=ON but ${KVTIER_PYTHON_WHY_NOT}")
  endif()
endif()
if(KVTIER_HAVE_PYTHON)
  message(STATUS "kvtier: Python package ON (${Python3_EXECUTABLE}, Python ${Python3_VERSION}, "
                 "pybind11 ${pybind11_VERSION}; KVTIER_PYTHON=${KVTIER_PYTHON})")
else()
  message(STATUS "kvtier: Python package OFF: ${KVTIER_PYTHON_WHY_NOT} (KVTIER_PYTHON=${KVTIER_PYTHON})")
endif()

# Where the built package lies: PYTHONPATH=${KVTIER_PYTHON_PACKAGE_DIR} makes `import kvtier` work.
set(KVTIER_PYTHON_PACKAGE_DIR ${PROJECT_BINARY_DIR}/python)
