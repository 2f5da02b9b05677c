# Decides whether the CUDA sources are built. KVTIER_CUDA=AUTO builds them when nvcc is found;
# ON requires it; OFF never looks. Whether a GPU answers is a run-time question (cuda_device.h),
# never a build-time one, so a toolkit without a GPU compiles everything and the GPU tests skip.
set(KVTIER_HAVE_CUDA OFF)
if(NOT KVTIER_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # Hopper (sm_90) explicitly: 'native' fails on a machine with no GPU.
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(KVTIER_HAVE_CUDA ON)
  elseif(KVTIER_CUDA STREQUAL "ON")
    message(FATAL_ERROR "KVTIER_CUDA=ON but no CUDA compiler (nvcc) was found")
  endif()
endif()
message(STATUS "kvtier: CUDA sources ${KVTIER_HAVE_CUDA} (KVTIER_CUDA=${KVTIER_CUDA})")

# CMake 3.25 does not know CUDA_STANDARD 20, so .cu files get -std=c++20 directly.
function(kvtier_cuda_target target)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20>)
endfunction()
