#!/usr/bin/env bash
# Rehearses the GPU check on a node without a package registry, here, without a GPU: in a bare
# Debian 12 (scripts/bare_root.sh) given what such a node has and nothing of towerflow's
# dependencies (a compiler, CMake and Ninja from PyPI, a Python venv with NVIDIA's
# nvidia-cudnn-cu13 and nvidia-nccl-cu13 wheels, the CUDA toolkit mounted read-only and seen
# without its own cuDNN and NCCL), the probe and build parts must pass with the bundle alone, the
# network cut off for them, and every GPU part must report "no GPU".
#
#   tests/gpu/rehearse_offline.sh [BUNDLE]     (default: makes one with scripts/gpu_bundle.sh)
#
# Needs root, Debian's package mirror and PyPI (for the node's stand-ins, about 900 MB of wheels),
# and `unshare --net` to cut the network. Prints the check's report; exit 0 when the rehearsal holds.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${TOWERFLOW_BARE_ROOT:-0}" != 1 ]; then
  bundle=${1:-}
  if [ -z "$bundle" ]; then
    mkdir -p build-rehearsal
    scripts/gpu_bundle.sh build-rehearsal/gpu-bundle
    bundle=build-rehearsal/gpu-bundle.tar.xz
  fi
  mkdir -p .rehearsal && cp "$bundle" .rehearsal/gpu-bundle.tar.xz
  trap 'rm -rf .rehearsal' EXIT
  TOWERFLOW_BARE_ROOT_CARRY=.rehearsal scripts/bare_root.sh tests/gpu/rehearse_offline.sh
  exit
fi

# Inside the bare root. The node's image: a compiler, Python, xz; CMake and Ninja as PyPI gives
# them; NVIDIA's cuDNN and NCCL wheels in a venv (where the node's PyTorch has them).
apt-get update -qq
apt-get install -y -qq --no-install-recommends g++ python3 python3-venv xz-utils > /dev/null
python3 -m venv /opt/node
/opt/node/bin/pip install --quiet --disable-pip-version-check cmake ninja nvidia-cudnn-cu13 nvidia-nccl-cu13
export PATH=/opt/node/bin:$PATH
for pkg in libeigen3-dev libprotobuf-dev libboost-dev catch2 nlohmann-json3-dev libcli11-dev; do
  if dpkg-query -W -f='${Status}' "$pkg" 2> /dev/null | grep -q "install ok installed"; then
    echo "rehearsal: $pkg is installed, so the rehearsal would prove nothing" >&2
    exit 1
  fi
done

# The toolkit as a node may have it: without cuDNN and NCCL (they come from the wheels). A tree
# of links to the toolkit's files, but for theirs, in each folder that holds headers or libraries.
lite=/opt/cuda-lite
mirror() {  # mirror SRC DST: DST/x -> SRC/x for every entry, the folders in $filtered walked into
  local src=$1 dst=$2 f name
  mkdir -p "$dst"
  for f in "$src"/*; do
    name=$(basename "$f")
    case "$name" in cudnn* | libcudnn* | nccl* | libnccl*) continue ;; esac
    if [ -d "$f" ] && [[ " $filtered " == *" ${f#/usr/local/cuda/} "* ]]; then
      mirror "$(readlink -f "$f")" "$dst/$name"
    else
      ln -s "$f" "$dst/$name"
    fi
  done
}
filtered="include lib lib64 targets targets/x86_64-linux targets/x86_64-linux/include targets/x86_64-linux/lib"
mirror /usr/local/cuda "$lite"
if find -L "$lite" -maxdepth 4 \( -name 'libcudnn*' -o -name 'cudnn*.h' -o -name 'libnccl*' -o -name 'nccl.h' \) | grep -q .; then
  echo "rehearsal: the toolkit's cuDNN or NCCL still shows in $lite" >&2
  exit 1
fi

# The check itself, with no network: what it needs must come from the bundle.
status=0
# The limits are a 16-core node's: this machine may have 2.
unshare --net -- env CUDA_HOME=$lite TW_GPU_CHECK_TIMEOUT_SCALE=$(( 16 / $(nproc) > 1 ? 16 / $(nproc) : 1 )) \
  tests/gpu/run_gpu_checks.sh --bundle .rehearsal/gpu-bundle.tar.xz --build build-rehearsal \
  --out build-rehearsal/report --budget 7200 || status=$?
report=build-rehearsal/report/gpu_steps.jsonl
python3 - "$report" << 'EOF'
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1])]
bad = []
for s in steps:
    if s["part"] in ("probe", "build") and s["result"] != "passed":
        bad.append(f"{s['part']}: {s['step']} {s['result']}")
    if s["part"] in ("trainer", "nccl", "train", "bench") and s["result"] != "no GPU":
        bad.append(f"{s['part']}: {s['step']} says {s['result']}, not 'no GPU'")
    if s["part"] == "parity" and "parity suite" in s["step"] and s["result"] != "no GPU":
        bad.append(f"parity: {s['step']} says {s['result']}, not 'no GPU'")
print(f"rehearsal: {len(steps)} steps; " + ("holds: probe and build pass offline, every GPU part says no GPU" if not bad
      else "FAILED: " + "; ".join(bad)))
sys.exit(1 if bad else 0)
EOF
