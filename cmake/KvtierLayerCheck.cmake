# The include check of kvtier's layers (cmake/KvtierLayers.cmake): every #include in
# src/<layer>/ and in the layer's public headers must name a header of that layer or of one it
# depends on. Public headers all live in include/kvtier/, so the compiler finds a wrong-way
# include; this finds it first, naming the file and line. Also fails on a public header or src/
# folder that no layer owns, and on library code including tests/, bench/ or examples/.
#
#   cmake -DKVTIER_SOURCE_DIR=<checkout> [-DKVTIER_LAYER_CHECK_STAMP=<file>] -P KvtierLayerCheck.cmake
#
# Run by ctest (kvtier_layer_check) and as a build step before the first layer compiles; the
# stamp file is written only when the check passes.
cmake_minimum_required(VERSION 3.25)

if(NOT DEFINED KVTIER_SOURCE_DIR)
  message(FATAL_ERROR "KvtierLayerCheck: KVTIER_SOURCE_DIR is not set")
endif()
include(${CMAKE_CURRENT_LIST_DIR}/KvtierLayers.cmake)

kvtier_layer_table_errors(errors)

# Who owns each public header, and which layers each layer may include.
foreach(layer IN LISTS KVTIER_LAYERS)
  foreach(header IN LISTS KVTIER_LAYER_${layer}_HEADERS)
    set(owner_of_${header} ${layer})
    if(NOT EXISTS ${KVTIER_SOURCE_DIR}/include/kvtier/${header})
      list(APPEND errors "cmake/KvtierLayers.cmake: kvtier/${header} (layer ${layer}) does not exist")
    endif()
  endforeach()
  kvtier_layer_closure(${layer} below)
  set(allowed_${layer} ${layer} ${below})
endforeach()

# Every file, in subfolders too (include/kvtier/c/ holds the C ABI): each needs an owner.
file(GLOB_RECURSE public_headers RELATIVE ${KVTIER_SOURCE_DIR}/include/kvtier
     ${KVTIER_SOURCE_DIR}/include/kvtier/*)
foreach(header IN LISTS public_headers)
  if(NOT DEFINED owner_of_${header})
    list(APPEND errors "include/kvtier/${header}: no layer owns this header; add it to cmake/KvtierLayers.cmake")
  endif()
endforeach()

file(GLOB src_entries RELATIVE ${KVTIER_SOURCE_DIR}/src ${KVTIER_SOURCE_DIR}/src/*)
foreach(entry IN LISTS src_entries)
  if(IS_DIRECTORY ${KVTIER_SOURCE_DIR}/src/${entry})
    if(NOT entry IN_LIST KVTIER_LAYERS)
      list(APPEND errors "src/${entry}/: not a layer; add it to KVTIER_LAYERS in cmake/KvtierLayers.cmake")
    endif()
  elseif(NOT entry STREQUAL "CMakeLists.txt")
    list(APPEND errors "src/${entry}: a source outside every layer folder")
  endif()
endforeach()

# check_file(<layer> <path relative to the checkout>): appends to `errors` and counts includes.
set(num_files 0)
set(num_includes 0)
function(check_file layer path)
  file(READ ${KVTIER_SOURCE_DIR}/${path} text)
  # One list element per line. Characters that CMake lists treat specially are masked first.
  string(REPLACE "\\" "@BS@" text "${text}")
  string(REPLACE ";" "@SC@" text "${text}")
  string(REPLACE "[" "@LB@" text "${text}")
  string(REPLACE "]" "@RB@" text "${text}")
  string(REPLACE "\n" ";" lines "${text}")
  set(line_number 0)
  set(found 0)
  foreach(line IN LISTS lines)
    math(EXPR line_number "${line_number} + 1")
    if(NOT line MATCHES "^[ \t]*#[ \t]*include[ \t]*[\"<]([^\">]+)[\">]")
      continue()
    endif()
    set(included ${CMAKE_MATCH_1})
    math(EXPR found "${found} + 1")
    set(owner)
    if(included MATCHES "^kvtier/(.+)$")
      set(header ${CMAKE_MATCH_1})
      if(NOT DEFINED owner_of_${header})
        list(APPEND errors "${path}:${line_number}: includes \"${included}\", which no layer owns (cmake/KvtierLayers.cmake)")
        continue()
      endif()
      set(owner ${owner_of_${header}})
    elseif(included MATCHES "^(tests|bench|examples)/")
      list(APPEND errors "${path}:${line_number}: the library includes \"${included}\" from ${CMAKE_MATCH_1}/")
      continue()
    elseif(included MATCHES "^([a-z_]+)/" AND CMAKE_MATCH_1 IN_LIST KVTIER_LAYERS)
      set(owner ${CMAKE_MATCH_1})
    else()
      continue()  # the standard library, abseil, system and third-party headers
    endif()
    if(NOT owner IN_LIST allowed_${layer})
      string(REPLACE ";" ", " may "${allowed_${layer}}")
      list(APPEND errors "${path}:${line_number}: layer ${layer} includes \"${included}\" of layer ${owner} (${layer} may include only ${may})")
    endif()
  endforeach()
  math(EXPR total "${num_includes} + ${found}")
  math(EXPR files "${num_files} + 1")
  set(num_includes ${total} PARENT_SCOPE)
  set(num_files ${files} PARENT_SCOPE)
  set(errors ${errors} PARENT_SCOPE)
endfunction()

foreach(layer IN LISTS KVTIER_LAYERS)
  file(GLOB_RECURSE sources RELATIVE ${KVTIER_SOURCE_DIR}
       ${KVTIER_SOURCE_DIR}/src/${layer}/*.h ${KVTIER_SOURCE_DIR}/src/${layer}/*.cc
       ${KVTIER_SOURCE_DIR}/src/${layer}/*.cu ${KVTIER_SOURCE_DIR}/src/${layer}/*.cuh)
  foreach(header IN LISTS KVTIER_LAYER_${layer}_HEADERS)
    if(EXISTS ${KVTIER_SOURCE_DIR}/include/kvtier/${header})
      list(APPEND sources include/kvtier/${header})
    endif()
  endforeach()
  list(SORT sources)
  foreach(path IN LISTS sources)
    check_file(${layer} ${path})
  endforeach()
endforeach()

if(errors)
  list(LENGTH errors num_errors)
  string(REPLACE ";" "\n  " text "${errors}")
  message(FATAL_ERROR "kvtier layer check: ${num_errors} problem(s) (layers in cmake/KvtierLayers.cmake):\n  ${text}\n")
endif()
message(STATUS "kvtier layer check: ${num_files} files, ${num_includes} includes, all within their layers")
if(DEFINED KVTIER_LAYER_CHECK_STAMP)
  file(TOUCH ${KVTIER_LAYER_CHECK_STAMP})
endif()
