# KVTIER_SANITIZE applies to every kvtier target through this interface library, so the presets
# need no global CMAKE_CXX_FLAGS. Dependencies from Debian (absl, gtest) stay uninstrumented.
add_library(kvtier_sanitizers INTERFACE)
if(KVTIER_SANITIZE)
  target_compile_options(kvtier_sanitizers INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${KVTIER_SANITIZE} -fno-omit-frame-pointer>)
  target_link_options(kvtier_sanitizers INTERFACE -fsanitize=${KVTIER_SANITIZE})
  if(KVTIER_SANITIZE MATCHES "undefined")
    target_compile_options(kvtier_sanitizers INTERFACE
      $<$<COMPILE_LANGUAGE:CXX>:-fno-sanitize-recover=undefined>)
  endif()
endif()

# KVTIER_BUILD_FUZZ: every kvtier target also gets libFuzzer's coverage instrumentation (without
# libFuzzer's main), so the fuzzer is guided by the library's branches, not only the harness's.
# The fuzz targets themselves add -fsanitize=fuzzer (tests/fuzz/CMakeLists.txt); the link option
# lets any other program built in the same tree (tests, examples) link the instrumented objects.
if(KVTIER_BUILD_FUZZ)
  target_compile_options(kvtier_sanitizers INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link>)
  target_link_options(kvtier_sanitizers INTERFACE -fsanitize=fuzzer-no-link)
endif()
