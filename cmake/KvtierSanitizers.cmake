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
