# kvtier_add_header_check(target): an object library with one translation unit per public header
# that includes only that header (twice, to check its guard). A header that relies on something
# it does not include fails to build (Seastar's cmake/CheckHeaders.cmake does the same).
function(kvtier_add_header_check target)
  # Recursive: the C ABI's kvtier/c/kvtier.h compiles alone as C++ too (tests/c compiles it as C).
  file(GLOB_RECURSE headers RELATIVE ${PROJECT_SOURCE_DIR}/include CONFIGURE_DEPENDS
       ${PROJECT_SOURCE_DIR}/include/kvtier/*.h)
  set(sources)
  foreach(header IN LISTS headers)
    string(MAKE_C_IDENTIFIER ${header} stem)
    set(source ${CMAKE_CURRENT_BINARY_DIR}/header_check/${stem}.cc)
    file(CONFIGURE OUTPUT ${source}
         CONTENT "#include \"${header}\"\n#include \"${header}\"\n")
    list(APPEND sources ${source})
  endforeach()
  add_library(${target} OBJECT ${sources})
  # Only the public interface: abseil (KVTIER_ABSL_PUBLIC, cmake/KvtierLayers.cmake) and the
  # include directory, nothing private of kvtier.
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR}/include)
  target_link_libraries(${target} PRIVATE ${KVTIER_ABSL_PUBLIC})
  target_compile_features(${target} PRIVATE cxx_std_20)
  kvtier_set_warnings(${target})
endfunction()
