#!/usr/bin/env bash
# Installs what the build needs, configures (CUDA when /usr/local/cuda exists) and builds into build/.
# Extra arguments go to the configure step, e.g. scripts/build.sh -DTOWERFLOW_CUDA=OFF
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
cuda=AUTO
[ -x /usr/local/cuda/bin/nvcc ] && cuda=ON
# The Python tests run with the environment install_deps.sh made (tensorboard, matplotlib).
venv=${TOWERFLOW_VENV:-$PWD/.venv}
cmake -S . -B build -G Ninja -DTOWERFLOW_CUDA="$cuda" -DPython3_EXECUTABLE="$venv/bin/python3" "$@"
cmake --build build -j"$(nproc)"
