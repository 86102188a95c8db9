#!/usr/bin/env bash
# Installs what towerflow builds and tests with, from Debian's packages and PyPI. Idempotent; needs
# root (or sudo). Works from a bare Debian 12 (debootstrap --variant=minbase): CI builds in one.
#   scripts/install_deps.sh          what the build and the tests need
#   scripts/install_deps.sh fuzz     that, and clang with libFuzzer (scripts/fuzz.sh, sanitize.sh)
# The CUDA toolkit, cuDNN and NCCL are not Debian packages: where /usr/local/cuda exists the
# build uses them, and without them it builds the CPU backend only.
#
# Python: the tests that read with TensorBoard's reader or draw with matplotlib run in a virtual
# environment of their own, $TOWERFLOW_VENV (default .venv in the source tree), made here with
# Debian's python3 and filled from PyPI; scripts/build.sh points CMake's Python3_EXECUTABLE at it.
# Where PyPI cannot be reached those tests report themselves skipped, naming the package.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
packages=(
  cmake ninja-build make g++ pkg-config  # make: CMake's default generator, Unix Makefiles
  libeigen3-dev          # CPU kernels
  catch2                 # tests
  libcli11-dev           # command-line flags
  nlohmann-json3-dev     # JSON output, platform descriptions, checkpoint metadata
  libbenchmark-dev       # micro-benchmarks
  libjpeg-dev libpng-dev # image-folder datasets
  libprotobuf-dev protobuf-compiler  # TensorBoard event files (Event and Summary messages)
  libboost-dev           # Boost.CRC: CRC-32C of TensorBoard's record framing; Boost.Random: mixup's Beta
  libonnx-dev            # towerflow_export --onnx (ONNX's protobuf classes)
  libopenmpi-dev openmpi-bin  # multi-process runs
  libdnnl-dev            # oneDNN 2.6, where oneDNN 3 (below) cannot be installed
  ocl-icd-opencl-dev     # Debian's oneDNN CMake config requires OpenCL (a Recommends, not a Depends)
  python3 python3-venv   # the Python tests and scripts (docs, plots, TensorBoard, mpirun cases)
  curl ca-certificates   # scripts/get_cifar10.sh
)
if [ "${1:-}" = fuzz ]; then
  # clang 16, not Debian 12's default 14: libstdc++'s <source_location> needs clang >= 15.
  packages+=(clang-16 libclang-rt-16-dev)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#packages[@]} packages present"
else
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  echo "install_deps: installing ${missing[*]}"
  $sudo_cmd apt-get update -qq
  # Packages named here, not their Recommends: each one the build needs is in the list above.
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The tests' Python packages (TensorBoard's own event reader, matplotlib for
# scripts/plot_metrics.py, ONNX Runtime for the exported models), in a virtual environment so that
# no system Python is touched.
venv=${TOWERFLOW_VENV:-$root/.venv}
python_packages=(tensorboard matplotlib onnxruntime)
if ! "$venv/bin/python3" -c "import tensorboard, matplotlib, onnxruntime" 2> /dev/null; then
  [ -x "$venv/bin/python3" ] || /usr/bin/python3 -m venv "$venv"
  echo "install_deps: pip installing ${python_packages[*]} into $venv (about 80 MB)"
  "$venv/bin/python3" -m pip install --quiet --disable-pip-version-check "${python_packages[@]}" ||
    echo "install_deps: could not install ${python_packages[*]} into $venv; the tests that read" \
         "with them will report themselves skipped"
fi

# oneDNN 3 (bf16 CPU kernels on AVX512-BF16 and AMX, fp32 candidates of --kernel_choice auto):
# Intel's wheels from PyPI, built on GNU OpenMP as Debian's oneDNN 2.6 is, installed as a prefix
# (lib/, include/, lib/cmake/dnnl) into $TOWERFLOW_ONEDNN_ROOT (default .deps/onednn in the source
# tree), where CMake looks before the system's (TOWERFLOW_ONEDNN_ROOT in
# cmake/TowerflowDependencies.cmake). Without PyPI the build takes Debian's 2.6.
onednn_version=2023.2.0  # oneDNN 3.2
onednn_root=${TOWERFLOW_ONEDNN_ROOT:-$root/.deps/onednn}
if [ -f "$onednn_root/lib/cmake/dnnl/dnnl-config.cmake" ] && [ ! -f "$onednn_root/.wheels" ]; then
  # A oneDNN this script did not install (a root of the user's own): taken as it is, never removed.
  echo "install_deps: oneDNN in $onednn_root was not installed here; leaving it as it is"
elif [ "$(cat "$onednn_root/.wheels" 2> /dev/null)" != "$onednn_version" ]; then
  echo "install_deps: pip installing oneDNN 3 (onednn-cpu-gomp $onednn_version, about 40 MB) into $onednn_root"
  [ -f "$onednn_root/.wheels" ] && rm -rf "$onednn_root"  # another version this script installed
  if "$venv/bin/python3" -m pip install --quiet --disable-pip-version-check --no-deps \
       --prefix "$onednn_root" "onednn-cpu-gomp==$onednn_version" "onednn-devel-cpu-gomp==$onednn_version"; then
    # A wheel holds no symbolic links: the library comes as three copies of 55 MB.
    (cd "$onednn_root/lib" && for so in libdnnl.so.*.*; do
       ln -sf "$so" "${so%.*}" && ln -sf "${so%.*}" libdnnl.so; done)
    echo "$onednn_version" > "$onednn_root/.wheels"
  else
    echo "install_deps: could not install oneDNN 3 from PyPI into $onednn_root; the build takes" \
         "Debian's oneDNN 2.6 (remove the folder's partial install before trying again)"
  fi
fi
