#!/usr/bin/env bash
# towerflow's benchmark suite in one command: builds the benchmarks, then runs bench/suite.py,
# which measures the machine's limits, every kernel and training configuration, and the peers
# (PyTorch, TensorFlow) side by side, and writes bench/results/<cpu>-<date>.{md,jsonl}.
#
#   scripts/bench.sh                    the full run (about 25 minutes on 2 cores with the peers)
#   scripts/bench.sh --quick            a smoke run on tiny settings (about a minute)
#   scripts/bench.sh --install-peers    first install torch and tensorflow-cpu into build/bench-venv
#   scripts/bench.sh --no-peers         towerflow only
#   scripts/bench.sh --gpu              also the GPU part (a CUDA build, on a machine with a GPU)
#
# Options of this script (the rest go to bench/suite.py; see python3 bench/suite.py --help):
#   --build DIR        the CMake build directory (default: build); configured here if it is not
#   --no-build         do not build; use what is in DIR
#   --install-peers    create DIR/bench-venv and pip install torch, tensorflow-cpu and numpy,
#                      saying first how much that downloads (about 3.3 GB) and, at a terminal,
#                      asking before it does
#   --peer-python PY   the Python with the peers (default: DIR/bench-venv/bin/python if it
#                      exists, else python3)
set -euo pipefail
cd "$(dirname "$0")/.."

build=build
do_build=1
install_peers=0
peer_python=""
pass=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --build=*) build=${1#*=}; shift ;;
    --no-build) do_build=0; shift ;;
    --install-peers) install_peers=1; shift ;;
    --peer-python) peer_python=$2; shift 2 ;;
    --peer-python=*) peer_python=${1#*=}; shift ;;
    -h|--help) sed -n '2,18p' "$0"; python3 bench/suite.py --help; exit 0 ;;
    *) pass+=("$1"); shift ;;
  esac
done

if [ "$do_build" = 1 ]; then
  if [ ! -f "$build/CMakeCache.txt" ]; then
    generator=(); command -v ninja >/dev/null && generator=(-G Ninja)
    cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release
  fi
  # The kernel benchmarks need Google Benchmark, the GPU ones a CUDA build: build those the
  # configuration has.
  available=$(cmake --build "$build" --target help 2>/dev/null || true)
  targets=(towerflow_bench_train towerflow_bench_allreduce towerflow_bench_alloc towerflow_bench_data)
  for t in towerflow_bench_kernels towerflow_bench_gpu_ops; do
    grep -q "$t" <<<"$available" && targets+=("$t")
  done
  cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"
fi

venv="$build/bench-venv"
if [ "$install_peers" = 1 ]; then
  # PyPI's torch wheel for Linux x86-64 brings CUDA libraries it does not need on a CPU (about
  # 3 GB in all); the CPU-only index (https://download.pytorch.org/whl/cpu) is smaller where it is
  # reachable. The size is measured and shown before anything large is downloaded.
  peers=(torch tensorflow-cpu numpy)
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip
  echo "bench: measuring what installing ${peers[*]} downloads (pip reads their metadata only; about a minute)"
  if ! "$venv/bin/python" bench/peers/download_size.py "${peers[@]}"; then
    echo "bench: could not measure it; expect about 3.3 GB (PyPI's torch brings CUDA libraries even to a CPU machine)"
  fi
  if [ -t 0 ]; then
    read -r -p "bench: download and install them into $venv? [Y/n] " answer
    case "$answer" in [nN]*) echo "bench: the peers were not installed"; exit 1 ;; esac
  fi
  "$venv/bin/pip" install "${peers[@]}"
fi
if [ -z "$peer_python" ]; then
  if [ -x "$venv/bin/python" ]; then peer_python="$venv/bin/python"; else peer_python=python3; fi
fi

exec python3 bench/suite.py --build "$build" --peer-python "$peer_python" "${pass[@]}"
