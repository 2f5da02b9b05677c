# Installs the already built kvtier into a scratch prefix, then configures, builds and runs
# tests/consumer against it with find_package(kvtier CONFIG). Run by ctest (cmake -P).
foreach(var KVTIER_BUILD_DIR KVTIER_CONSUMER_SOURCE KVTIER_WORK_DIR KVTIER_GENERATOR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "${var} is not set")
  endif()
endforeach()

set(prefix ${KVTIER_WORK_DIR}/prefix)
set(build ${KVTIER_WORK_DIR}/build)
file(REMOVE_RECURSE ${KVTIER_WORK_DIR})

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()

run(${CMAKE_COMMAND} --install ${KVTIER_BUILD_DIR} --prefix ${prefix})
run(${CMAKE_COMMAND} -S ${KVTIER_CONSUMER_SOURCE} -B ${build} -G ${KVTIER_GENERATOR}
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_CXX_COMPILER=${KVTIER_CXX_COMPILER})
run(${CMAKE_COMMAND} --build ${build})
run(${build}/kvtier_consumer)
run(${build}/kvtier_c_consumer)
