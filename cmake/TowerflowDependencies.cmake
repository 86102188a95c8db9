# Finds every dependency once. Each optional backend is AUTO|ON|OFF: AUTO uses what it finds,
# ON fails here with what is missing and how to install it, OFF skips the search.
find_package(Threads REQUIRED)

find_package(Eigen3 3.3 CONFIG QUIET)
if(NOT Eigen3_FOUND)
  message(FATAL_ERROR "Eigen 3 was not found. Install it with: sudo apt-get install libeigen3-dev "
                      "(or run scripts/install_deps.sh)")
endif()
find_package(nlohmann_json 3 CONFIG QUIET)
if(NOT nlohmann_json_FOUND)
  message(FATAL_ERROR "nlohmann-json was not found. Install it with: sudo apt-get install nlohmann-json3-dev "
                      "(or run scripts/install_deps.sh)")
endif()
find_package(CLI11 CONFIG QUIET)
if(NOT CLI11_FOUND)
  message(FATAL_ERROR "CLI11 was not found. Install it with: sudo apt-get install libcli11-dev "
                      "(or run scripts/install_deps.sh)")
endif()
find_package(Protobuf QUIET)
if(NOT Protobuf_FOUND)
  message(FATAL_ERROR "Protocol Buffers were not found (TensorBoard event files). Install them with: "
                      "sudo apt-get install libprotobuf-dev protobuf-compiler (or run scripts/install_deps.sh)")
endif()
find_package(Boost 1.71 QUIET)   # header-only: Boost.CRC's CRC-32C (io/crc32c.h): TensorBoard's record framing, checkpoint checksums
if(NOT Boost_FOUND)
  message(FATAL_ERROR "Boost's headers were not found. Install them with: sudo apt-get install libboost-dev "
                      "(or run scripts/install_deps.sh)")
endif()
find_package(JPEG QUIET)
find_package(PNG QUIET)
set(TW_HAVE_JPEG ${JPEG_FOUND})
set(TW_HAVE_PNG ${PNG_FOUND})

if(TOWERFLOW_BUILD_TESTS)
  find_package(Catch2 2 CONFIG QUIET)
  if(NOT Catch2_FOUND)
    message(FATAL_ERROR "Catch2 was not found. Install it with: sudo apt-get install catch2 "
                        "(or configure with -DTOWERFLOW_BUILD_TESTS=OFF)")
  endif()
endif()
if(TOWERFLOW_BUILD_BENCH)
  find_package(benchmark CONFIG QUIET)
  set(TW_HAVE_GBENCH ${benchmark_FOUND})
endif()

# ---- CUDA ------------------------------------------------------------------------------------
set(TW_HAVE_CUDA OFF)
string(TOUPPER "${TOWERFLOW_CUDA}" _tw_cuda)
if(NOT _tw_cuda STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80 90)   # A100 and H100; extend with -DCMAKE_CUDA_ARCHITECTURES=...
    endif()
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    find_path(TW_CUDNN_INCLUDE cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/include /usr/local/cuda/include)
    find_library(TW_CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/lib/x86_64-linux-gnu)
    find_path(TW_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/include /usr/local/cuda/include)
    find_library(TW_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/lib/x86_64-linux-gnu)
    set(_tw_missing "")
    if(NOT TW_CUDNN_INCLUDE OR NOT TW_CUDNN_LIBRARY)
      list(APPEND _tw_missing "cuDNN 9 (cudnn.h, libcudnn.so)")
    endif()
    if(NOT TW_NCCL_INCLUDE OR NOT TW_NCCL_LIBRARY)
      list(APPEND _tw_missing "NCCL (nccl.h, libnccl.so)")
    endif()
    if(_tw_missing)
      if(_tw_cuda STREQUAL "ON")
        message(FATAL_ERROR "TOWERFLOW_CUDA=ON but ${_tw_missing} not found next to the CUDA toolkit "
                            "(${CUDAToolkit_LIBRARY_DIR}). Install NVIDIA's cudnn9-cuda-13 and libnccl-dev "
                            "packages, or configure with -DTOWERFLOW_CUDA=OFF.")
      endif()
      message(STATUS "CUDA found but ${_tw_missing} missing: building without CUDA")
    else()
      set(TW_HAVE_CUDA ON)
    endif()
  elseif(_tw_cuda STREQUAL "ON")
    message(FATAL_ERROR "TOWERFLOW_CUDA=ON but no CUDA compiler (nvcc) was found. Install the CUDA "
                        "toolkit under /usr/local/cuda, pass -DCMAKE_CUDA_COMPILER=/path/to/nvcc, "
                        "or configure with -DTOWERFLOW_CUDA=OFF.")
  endif()
endif()

# ---- oneDNN (bf16 CPU kernels, fp32 kernel-choice candidates; without it bf16 runs emulated) ----
# TOWERFLOW_ONEDNN_ROOT is where scripts/install_deps.sh puts oneDNN 3 from PyPI (Intel's
# onednn-cpu-gomp wheels, GNU OpenMP as Debian's); a oneDNN there is taken before the system's
# (Debian's libdnnl-dev, oneDNN 2.6). An empty root, or none there, leaves the system's.
set(TOWERFLOW_ONEDNN_ROOT "${PROJECT_SOURCE_DIR}/.deps/onednn" CACHE PATH
    "A oneDNN install prefix taken before the system's (scripts/install_deps.sh fills the default)")
set(TW_HAVE_ONEDNN OFF)
string(TOUPPER "${TOWERFLOW_ONEDNN}" _tw_onednn)
if(NOT _tw_onednn STREQUAL "OFF")
  if(TOWERFLOW_ONEDNN_ROOT AND EXISTS "${TOWERFLOW_ONEDNN_ROOT}/lib/cmake/dnnl")
    # A build folder configured before the root was filled remembers the system's oneDNN in
    # dnnl_DIR, which find_package would take first.
    string(FIND "${dnnl_DIR}" "${TOWERFLOW_ONEDNN_ROOT}/" _tw_at)
    if(dnnl_DIR AND NOT _tw_at EQUAL 0)
      unset(dnnl_DIR CACHE)
    endif()
    find_package(dnnl CONFIG QUIET PATHS "${TOWERFLOW_ONEDNN_ROOT}" NO_DEFAULT_PATH)
  endif()
  if(NOT dnnl_FOUND)
    find_package(dnnl CONFIG QUIET)
  endif()
  find_package(OpenMP COMPONENTS CXX QUIET)
  if(dnnl_FOUND AND dnnl_VERSION VERSION_LESS 2)
    message(WARNING "oneDNN ${dnnl_VERSION} (${dnnl_DIR}) is older than 2.0; building without it")
  elseif(dnnl_FOUND AND OpenMP_CXX_FOUND)
    set(TW_HAVE_ONEDNN ON)
  endif()
  if(NOT TW_HAVE_ONEDNN AND _tw_onednn STREQUAL "ON")
    message(FATAL_ERROR "TOWERFLOW_ONEDNN=ON but oneDNN 2 or 3 (or OpenMP) was not found. Install it "
                        "with scripts/install_deps.sh (oneDNN 3 from PyPI) or sudo apt-get install "
                        "libdnnl-dev, or configure with -DTOWERFLOW_ONEDNN=OFF.")
  endif()
endif()

# ---- MPI -------------------------------------------------------------------------------------
set(TW_HAVE_MPI OFF)
string(TOUPPER "${TOWERFLOW_MPI}" _tw_mpi)
if(NOT _tw_mpi STREQUAL "OFF")
  find_package(MPI COMPONENTS CXX QUIET)
  if(MPI_CXX_FOUND)
    set(TW_HAVE_MPI ON)
  elseif(_tw_mpi STREQUAL "ON")
    message(FATAL_ERROR "TOWERFLOW_MPI=ON but no MPI was found. Install OpenMPI with: "
                        "sudo apt-get install libopenmpi-dev openmpi-bin, or configure with -DTOWERFLOW_MPI=OFF.")
  endif()
endif()
