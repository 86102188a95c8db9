#!/usr/bin/env bash
# Installs the Debian packages towerflow builds with. Idempotent; needs root (or sudo).
#   scripts/install_deps.sh          what the build needs
#   scripts/install_deps.sh fuzz     that, and clang with libFuzzer (scripts/fuzz.sh)
# The CUDA toolkit, cuDNN and NCCL are not Debian packages: where /usr/local/cuda exists the
# build uses them, and without them it builds the CPU backend only.
set -euo pipefail
packages=(
  cmake ninja-build g++ pkg-config
  libeigen3-dev          # CPU kernels
  catch2                 # tests
  libcli11-dev           # command-line flags
  nlohmann-json3-dev     # JSON output, platform descriptions, checkpoint metadata
  libbenchmark-dev       # micro-benchmarks
  libjpeg-dev libpng-dev # image-folder datasets
  libprotobuf-dev protobuf-compiler  # TensorBoard event files (Event and Summary messages)
  libboost-dev           # Boost.CRC: CRC-32C of TensorBoard's record framing
  libopenmpi-dev openmpi-bin  # multi-process runs
  libdnnl-dev            # oneDNN: bf16 CPU kernels (AVX512-BF16, AMX)
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
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Python packages some tests read with: TensorBoard's own event reader, matplotlib for
# scripts/plot_metrics.py. Without them (no network, no pip) those tests report themselves skipped.
python_packages=(tensorboard matplotlib)
if command -v python3 > /dev/null && ! python3 -c "import tensorboard, matplotlib" 2> /dev/null; then
  echo "install_deps: pip installing ${python_packages[*]}"
  python3 -m pip install --quiet "${python_packages[@]}" 2> /dev/null ||
    python3 -m pip install --quiet --break-system-packages "${python_packages[@]}" ||
    echo "install_deps: could not install ${python_packages[*]}; the tests that read with them will be skipped"
fi
