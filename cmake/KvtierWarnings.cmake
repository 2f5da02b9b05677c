# kvtier_set_warnings(target): the project's warning set, applied per target (no global flags).
# -Wno-missing-field-initializers: options structs are filled with designated initializers that
# leave fields at their documented defaults, which GCC 12 would flag.
function(kvtier_set_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
      -Wold-style-cast -Wcast-align -Woverloaded-virtual -Wimplicit-fallthrough
      -Wno-missing-field-initializers>
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:Clang>>:-Wthread-safety>)
endfunction()
