#!/usr/bin/env bash
# The GPU checks, in parts that each fit a short slot on a GPU node, with or without a package
# registry there (docs/gpus.md):
#
#   tests/gpu/run_gpu_checks.sh [--bundle DIR|DIR.tar.xz] [--only PARTS] [--out DIR] [--build DIR]
#                               [--budget SECONDS] [--steps N]
#
# PARTS, comma-separated, in this order (default: all of them):
#   probe    driver, toolkit, cuDNN, cuBLAS, NCCL, build tools and the bundle, found and their
#            versions; the GPUs as CUDA sees them (CUDA_VISIBLE_DEVICES honoured). Fails with the
#            list of what is missing.
#   build    configure (CUDA on, for the GPU's own architecture; cuDNN and NCCL from the toolkit or
#            from Python's nvidia-cudnn-cu13 / nvidia-nccl-cu13 wheels; the bundle's packages) and
#            build only the targets the checks run
#   parity   every GPU kernel against its CPU twin (test_core_cuda_parity: max error per op and
#            dtype), and the CUDA checks that need no GPU (test_core_cuda)
#   trainer  GPU towers against CPU towers (test_tower_trainer_gpu)
#   nccl     the NCCL communicator, one rank, and two ranks on two GPUs
#   train    cifar10_train on /gpu:0 in fp32, bf16 and fp16, each against the same training on one
#            CPU tower, with the tolerance taken from that CPU run and a second one that differs
#            only in summation order (tests/gpu/compare_loss_curves.py); with 2 GPUs, 2 GPU towers
#            with each reduction too, and 2 processes x 1 GPU under mpirun where the build has MPI
#   bench    a traced ResNet-20 run on /gpu:0 (where a step's time goes, op by op), then ResNet-20
#            and tfcnn training on /gpu:0 in fp32, bf16 and fp16, towerflow
#            (towerflow_bench_train) and PyTorch (bench/peers/torch_cifar_bench.py --device cuda,
#            channels-last, autocast) alternating, and their ratios; the airbench94 recipe for one
#            epoch, towerflow on /gpu:0 and bench/peers/airbench94_torch.py on the same GPU
#
# Every command runs under `timeout` (its limit is for a 16-core node; TW_GPU_CHECK_TIMEOUT_SCALE=N
# multiplies them on a slower machine); GPU binaries run one at a time with
# TOWERFLOW_FORCE_GPU_ALLOW_GROWTH=true. A step is passed, FAILED, skipped (exit 77, or a part
# that needs what is missing) or "no GPU"; once the parts have used --budget seconds (900) in all,
# the remaining steps are skipped as over budget, and a step still running when the budget ends
# is stopped and recorded as skipped, not as a timeout: a slot's end never loses the report.
# Parts can run in separate invocations: their results accumulate in BUILD/checks/, and every
# invocation writes the report so far to --out DIR
# (default BUILD/report): gpu_report.md (every step with its result and time, the parity errors,
# the loss-curve comparisons, the benchmark figures), gpu_steps.jsonl (one JSON line per step) and
# gpu_logs.tar.xz (every log). Exit status: 0 when no step failed, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
bundle="" only="probe,build,parity,trainer,nccl,train,bench" out="" build=build-gpu budget=900 steps=300
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) bundle=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    -h | --help) sed -n '2,38p' "$0"; exit 0 ;;
    *) echo "run_gpu_checks: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for p in ${only//,/ }; do
  case "$p" in probe | build | parity | trainer | nccl | train | bench) ;;
    *) echo "run_gpu_checks: --only $only: '$p' is not a part; use probe,build,parity,trainer,nccl,train,bench" >&2; exit 2 ;;
  esac
done
mkdir -p "$build"
build=$(cd "$build" && pwd)
out=${out:-$build/report}
state=$build/checks
mkdir -p "$state/logs" "$out"
results=$state/steps.jsonl
touch "$results"
export TOWERFLOW_FORCE_GPU_ALLOW_GROWTH=true
failed=0

# The bundle (scripts/gpu_bundle.sh): a folder, or its .tar.xz unpacked once next to the build.
if [ -n "$bundle" ]; then
  if [ -f "$bundle" ]; then
    mkdir -p "$state/bundle"
    [ -d "$state/bundle/usr" ] || tar -C "$state/bundle" --strip-components=1 -xJf "$bundle" ||
      { echo "run_gpu_checks: cannot unpack the bundle $bundle" >&2; exit 2; }
    bundle=$state/bundle
  fi
  [ -d "$bundle/usr/include" ] || { echo "run_gpu_checks: $bundle is no bundle (scripts/gpu_bundle.sh makes one)" >&2; exit 2; }
  bundle=$(cd "$bundle" && pwd)
  export PATH="$bundle/usr/bin:$PATH"
  export LD_LIBRARY_PATH="$bundle/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

json_str() { python3 -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$1" 2>/dev/null || printf '"%s"' "${1//\"/\'}"; }
record() {  # record PART NAME RESULT SECONDS LOG [NOTE]
  local line="{\"part\":\"$1\",\"step\":$(json_str "$2"),\"result\":\"$3\",\"seconds\":$4,\"log\":\"${5#$state/}\",\"note\":$(json_str "${6:-}")}"
  echo "$line" >> "$results"
  echo "$line"
  case "$3" in FAILED | timeout) failed=1 ;; esac
}
used() {  # seconds the recorded steps took, all invocations together
  python3 -c 'import json,sys; print(int(sum(json.loads(l)["seconds"] for l in open(sys.argv[1]) if l.strip())))' "$results" 2>/dev/null || echo 0
}
# step PART NAME TIMEOUT LOG COMMAND...: runs the command under timeout, records its result.
step() {
  local part=$1 name=$2 limit=$3 log=$4; shift 4
  if [ "$(used)" -ge "$budget" ]; then
    record "$part" "$name" "skipped" 0 "$log" "over the ${budget}-second budget"
    return 1
  fi
  if [[ "$1" == "$build/bin/"* ]] && [ ! -x "$1" ]; then
    record "$part" "$name" "skipped" 0 "$log" "$(basename "$1") is not built: run the build part first"
    return 1
  fi
  local t0 rc left capped=0
  t0=$(date +%s)
  limit=$(( limit * ${TW_GPU_CHECK_TIMEOUT_SCALE:-1} ))
  # No step runs past the budget: a slot's end stops it, and it is told apart from a hang.
  left=$(( budget - $(used) ))
  [ "$limit" -gt "$left" ] && { limit=$left; capped=1; }
  timeout --kill-after=15 "$limit" "$@" > "$log" 2>&1
  rc=$?
  local dt=$(( $(date +%s) - t0 ))
  case $rc in
    0) record "$part" "$name" "passed" "$dt" "$log" ;;
    77) record "$part" "$name" "skipped" "$dt" "$log" "$(grep -m1 -i 'skip' "$log" | cut -c1-200)" ;;
    124 | 137) if [ $capped = 1 ]; then
                 record "$part" "$name" "skipped" "$dt" "$log" "stopped after ${limit} s, at the end of the ${budget}-second budget"
               else
                 record "$part" "$name" "timeout" "$dt" "$log" "killed after ${limit} s"
               fi ;;
    *) record "$part" "$name" "FAILED" "$dt" "$log" "exit $rc: $(tail -n 3 "$log" | tr '\n' ' ' | cut -c1-300)" ;;
  esac
  return $rc
}

# ---- what the probe finds (also read by the later parts) ------------------------------------
cuda_home=${CUDA_HOME:-/usr/local/cuda}
[ -x "$cuda_home/bin/nvcc" ] || cuda_home=$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /x/x)")")
wheel_dir() {  # the folder of an nvidia-* wheel's package (nvidia.cudnn, ...), if Python has it
  python3 -c "import importlib, sys; m = importlib.import_module(sys.argv[1]); print(list(m.__path__)[0])" "$1" 2>/dev/null
}
find_lib() {  # find_lib NAME HEADER LIB WHEEL: sets NAME_INCLUDE and NAME_LIBRARY from the toolkit, the system or the wheel
  local name=$1 header=$2 lib=$3 wheel=$4 d inc="" so=""
  for d in "$cuda_home/include" /usr/include /usr/local/include; do [ -f "$d/$header" ] && { inc=$d; break; }; done
  for d in "$cuda_home/lib64" "$cuda_home/lib" /usr/lib/x86_64-linux-gnu /usr/local/lib; do
    so=$(ls "$d/$lib".so "$d/$lib".so.[0-9]* 2>/dev/null | head -1); [ -n "$so" ] && break
  done
  if [ -z "$inc" ] || [ -z "$so" ]; then
    d=$(wheel_dir "$wheel")
    if [ -n "$d" ] && [ -f "$d/include/$header" ]; then
      inc=$d/include
      so=$(ls "$d/lib/$lib".so* 2>/dev/null | head -1)
    fi
  fi
  printf -v "${name}_INCLUDE" '%s' "$inc"
  printf -v "${name}_LIBRARY" '%s' "$so"
}
header_version() {  # header_version FILE MAJOR MINOR PATCH: "9.19.0" from #define lines
  local f=$1 v="" m
  for m in "$2" "$3" "$4"; do v+="$(awk -v k="$m" '$1=="#define" && $2==k {print $3; exit}' "$f" 2>/dev/null)."; done
  echo "${v%.}"
}
probe_env() {
  find_lib CUDNN cudnn_version.h libcudnn nvidia.cudnn
  find_lib NCCL nccl.h libnccl nvidia.nccl
  find_lib CUBLAS cublas_api.h libcublas nvidia.cublas
  for lib in "$CUDNN_LIBRARY" "$NCCL_LIBRARY" "$CUBLAS_LIBRARY"; do
    [ -n "$lib" ] && case ":${LD_LIBRARY_PATH:-}:" in *":$(dirname "$lib"):"*) ;; *) LD_LIBRARY_PATH="$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;; esac
  done
  export LD_LIBRARY_PATH
}
probe_env
gpu_info() {  # the probe's key=value output, made once per build folder
  if [ ! -s "$state/probe.txt" ] && [ -x "$cuda_home/bin/nvcc" ]; then
    "$cuda_home/bin/nvcc" -o "$state/probe" tests/gpu/probe.cu > "$state/logs/probe_build.log" 2>&1 &&
      timeout 60 "$state/probe" > "$state/probe.txt" 2>&1
  fi
  cat "$state/probe.txt" 2>/dev/null
}
ngpu=$(gpu_info | awk -F= '$1=="gpus" {print $2}')
ngpu=${ngpu:-0}
no_gpu=$(gpu_info | awk -F= '$1=="no_gpu" {print $2}')
[ "$ngpu" -gt 0 ] || no_gpu=${no_gpu:-"the GPU probe did not run (no nvcc, or it failed: $state/logs/probe_build.log)"}

part_probe() {
  local log=$state/logs/probe.log missing=() t0 v
  t0=$(date +%s)
  {
    echo "## probe $(date -u '+%Y-%m-%d %H:%M UTC') on $(uname -n), $(nproc) CPU threads"
    echo "os: $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"); glibc $(ldd --version 2>/dev/null | head -1 | awk '{print $NF}')"
    if command -v nvidia-smi > /dev/null; then
      echo "nvidia-smi: $(nvidia-smi --query-gpu=index,name,compute_cap,memory.total,driver_version --format=csv,noheader 2>&1 | paste -sd';')"
    else
      echo "nvidia-smi: not found"
    fi
    echo "CUDA runtime's view (tests/gpu/probe.cu; CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}): $(gpu_info | paste -sd' ')"
    v=$("$cuda_home/bin/nvcc" --version 2>/dev/null | grep -o 'release [0-9.]*' | cut -d' ' -f2)
    echo "toolkit: ${v:-none} at $cuda_home"
    [ -n "$v" ] || missing+=("the CUDA toolkit (nvcc under /usr/local/cuda, or CUDA_HOME)")
    local drv; drv=$(gpu_info | awk -F= '$1=="driver" {print $2}'); local rt; rt=$(gpu_info | awk -F= '$1=="runtime" {print $2}')
    if [ -n "$drv" ] && [ "$drv" != 0 ] && [ -n "$rt" ] && [ "$drv" -lt "$rt" ]; then
      echo "driver: supports CUDA $((drv / 1000)).$((drv % 1000 / 10)), older than the toolkit's $((rt / 1000)).$((rt % 1000 / 10))"
      missing+=("a driver for CUDA $((rt / 1000)).$((rt % 1000 / 10)) (R580 or later for CUDA 13)")
    fi
    echo "cuDNN: ${CUDNN_LIBRARY:-not found} $( [ -n "$CUDNN_INCLUDE" ] && header_version "$CUDNN_INCLUDE/cudnn_version.h" CUDNN_MAJOR CUDNN_MINOR CUDNN_PATCHLEVEL)"
    [ -n "$CUDNN_LIBRARY" ] || missing+=("cuDNN 9 (the toolkit's, or Python's nvidia-cudnn-cu13 wheel)")
    echo "NCCL: ${NCCL_LIBRARY:-not found} $( [ -n "$NCCL_INCLUDE" ] && header_version "$NCCL_INCLUDE/nccl.h" NCCL_MAJOR NCCL_MINOR NCCL_PATCH)"
    [ -n "$NCCL_LIBRARY" ] || missing+=("NCCL (the toolkit's, or Python's nvidia-nccl-cu13 wheel)")
    echo "cuBLAS: ${CUBLAS_LIBRARY:-not found} $( [ -n "$CUBLAS_INCLUDE" ] && header_version "$CUBLAS_INCLUDE/cublas_api.h" CUBLAS_VER_MAJOR CUBLAS_VER_MINOR CUBLAS_VER_PATCH)"
    [ -n "$CUBLAS_LIBRARY" ] || missing+=("cuBLAS (the CUDA toolkit's)")
    for tool in cmake ninja g++ python3; do
      if command -v $tool > /dev/null; then echo "$tool: $($tool --version 2>&1 | head -1)"; else echo "$tool: not found"; missing+=("$tool"); fi
    done
    echo "PyTorch (the bench part's peer): $(python3 -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)' 2>/dev/null || echo 'not found: the bench part runs towerflow alone')"
    if [ -n "$bundle" ]; then
      echo "bundle: $bundle ($(head -2 "$bundle/BUNDLE.txt" 2>/dev/null | tail -1))"
      # Its shared libraries were built against Debian 12's glibc and libstdc++: protoc shows whether they load here.
      if protoc --version > /dev/null 2>&1; then echo "bundle's protoc: $(protoc --version)"; else
        echo "bundle's protoc does not run here: $(protoc --version 2>&1 | head -2 | paste -sd' ')"
        missing+=("a glibc and libstdc++ as new as Debian 12's, for the bundle's protobuf (or the node's own protobuf, without --bundle)")
      fi
    else
      echo "bundle: none (the build uses this machine's packages)"
    fi
    if [ ${#missing[@]} -gt 0 ]; then
      echo "MISSING:"; printf '  - %s\n' "${missing[@]}"
    fi
    [ "$ngpu" -gt 0 ] && echo "GPUs: $ngpu" || echo "GPUs: none ($no_gpu): the GPU parts will say no GPU"
  } > "$log" 2>&1
  cat "$log"
  if grep -q '^MISSING:' "$log"; then
    record probe "probe" "FAILED" $(( $(date +%s) - t0 )) "$log" "missing: $(sed -n '/^MISSING:/,$p' "$log" | tail -n +2 | sed 's/^  - //' | paste -sd';')"
  else
    record probe "probe" "passed" $(( $(date +%s) - t0 )) "$log" "$ngpu GPU(s)"
  fi
}

targets=(test_core_cuda_parity test_core_cuda test_tower_trainer_gpu test_nccl_communicator cifar10_train
         towerflow_bench_train towerflow_devices)
part_build() {
  local arch cfg=()
  arch=$(gpu_info | awk -F'|' '/^gpu0=/ {print $2}' | tr -d .)
  arch=${CMAKE_CUDA_ARCHITECTURES:-${arch:-90}}
  cfg=(-S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTOWERFLOW_CUDA=ON -DTOWERFLOW_CUDA_WERROR=OFF
       "-DCMAKE_CUDA_ARCHITECTURES=$arch" -DCMAKE_CUDA_COMPILER="$cuda_home/bin/nvcc"
       -DTOWERFLOW_ONEDNN=OFF
       "-DTW_CUDNN_INCLUDE=$CUDNN_INCLUDE" "-DTW_CUDNN_LIBRARY=$CUDNN_LIBRARY"
       "-DTW_NCCL_INCLUDE=$NCCL_INCLUDE" "-DTW_NCCL_LIBRARY=$NCCL_LIBRARY")
  if [ -z "$bundle" ]; then
    cfg+=(-DTOWERFLOW_MPI=AUTO)  # the machine's Open MPI, where it has one: the 2-process run
  else
    local lib=$bundle/usr/lib/x86_64-linux-gnu
    cfg+=(-DTOWERFLOW_MPI=OFF "-DCMAKE_PREFIX_PATH=$bundle/usr" "-DProtobuf_INCLUDE_DIR=$bundle/usr/include"
          "-DProtobuf_LIBRARY=$lib/libprotobuf.so" "-DProtobuf_PROTOC_EXECUTABLE=$bundle/usr/bin/protoc"
          "-DBoost_DIR=$(ls -d "$lib"/cmake/Boost-* | head -1)" -DCMAKE_DISABLE_FIND_PACKAGE_benchmark=ON
          # Named, not searched: a node that is not Debian-like does not look in lib/x86_64-linux-gnu.
          "-DJPEG_INCLUDE_DIR=$bundle/usr/include" "-DJPEG_LIBRARY=$lib/libjpeg.so"
          "-DPNG_PNG_INCLUDE_DIR=$bundle/usr/include" "-DPNG_LIBRARY=$lib/libpng.so"
          "-DZLIB_INCLUDE_DIR=$bundle/usr/include" "-DZLIB_LIBRARY=$lib/libz.so")
  fi
  step build "configure (CUDA on, sm_$arch, cuDNN $(basename "$CUDNN_LIBRARY"), NCCL $(basename "$NCCL_LIBRARY"))" 240 \
    "$state/logs/configure.log" cmake "${cfg[@]}" || return
  step build "build ${targets[*]} ($(nproc) jobs)" 540 "$state/logs/build.log" \
    cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"
}

needs_gpu() {  # needs_gpu PART NAME: records "no GPU" and returns 1 where there is none
  if [ "$ngpu" -gt 0 ]; then return 0; fi
  record "$1" "$2" "no GPU" 0 "" "$no_gpu"
  return 1
}
bin() { echo "$build/bin/$1"; }

part_parity() {
  step parity "CUDA checks without a GPU (test_core_cuda)" 120 "$state/logs/core_cuda.log" "$(bin test_core_cuda)"
  needs_gpu parity "[cuda] parity suite (test_core_cuda_parity)" || return
  step parity "[cuda] parity suite (test_core_cuda_parity)" 420 "$state/logs/parity.log" \
    "$(bin test_core_cuda_parity)" --durations yes
}
part_trainer() {
  needs_gpu trainer "GPU towers vs CPU towers (test_tower_trainer_gpu)" || return
  step trainer "GPU towers vs CPU towers (test_tower_trainer_gpu)" 420 "$state/logs/trainer_gpu.log" \
    "$(bin test_tower_trainer_gpu)" --durations yes
}
part_nccl() {
  needs_gpu nccl "NCCL communicator, one rank" || return
  step nccl "NCCL communicator, one rank (test_nccl_communicator)" 180 "$state/logs/nccl1.log" "$(bin test_nccl_communicator)"
  if [ "$ngpu" -ge 2 ]; then
    step nccl "NCCL communicator, two ranks on two GPUs" 180 "$state/logs/nccl2.log" "$(bin test_nccl_communicator)" --two-gpu
  else
    record nccl "NCCL communicator, two ranks" "skipped" 0 "" "needs 2 GPUs; CUDA sees $ngpu"
  fi
}

train_run() {  # train_run TAG DEVICES EXTRA...: one cifar10_train run, logged as train_TAG
  local tag=$1 devices=$2; shift 2
  step train "cifar10_train $tag on $devices ($steps steps)" 300 "$state/logs/train_$tag.log" \
    "$(bin cifar10_train)" --model resnet20 --batch_size 64 --max_steps "$steps" --log_every 10 --json \
    --eval_every 1 --builtin_train_size 6400 --builtin_test_size 1000 --loader_threads 2 --save_every 0 \
    --tensorboard=false --start_over delete --devices "$devices" --train_dir "$state/runs/$tag" "$@"
}
compare_runs() {  # compare_runs NAME GPU_TAG CPU_TAG CPU2_TAG
  step train "loss curves: $1" 60 "$state/logs/compare_$2.log" python3 tests/gpu/compare_loss_curves.py --json \
    "$state/logs/train_$2.log" "$state/logs/train_$3.log" "$state/logs/train_$4.log"
}
part_train() {
  needs_gpu train "cifar10_train on the GPU against the CPU" || return
  mkdir -p "$state/runs"
  for precision in fp32 bf16 fp16; do
    # The CPU twin, and the same training on 2 CPU towers with synchronised batch norm: the same
    # arithmetic summed in another order, whose distance from the first bounds the GPU's.
    train_run "cpu1_$precision" /cpu:0 --device_count CPU=1 --precision "$precision"
    train_run "cpu2_$precision" /cpu:0,/cpu:1 --device_count CPU=2 --batch_norm sync --precision "$precision"
    train_run "gpu1_$precision" /gpu:0 --precision "$precision"
    compare_runs "/gpu:0 against /cpu:0, $precision" "gpu1_$precision" "cpu1_$precision" "cpu2_$precision"
  done
  if [ "$ngpu" -ge 2 ]; then
    train_run "cpu2_per_tower" /cpu:0,/cpu:1 --device_count CPU=2
    train_run "cpu2_per_tower_b" /cpu:0,/cpu:1 --device_count CPU=2 --reduction parameter_device
    for reduction in all_reduce bucketed:0.05 parameter_device; do
      tag=gpu2_${reduction%%:*}
      train_run "$tag" /gpu:0,/gpu:1 --reduction "$reduction"
      compare_runs "/gpu:0,/gpu:1 $reduction against 2 CPU towers" "$tag" cpu2_per_tower cpu2_per_tower_b
    done
    # Across processes: 2 x 1 GPU (task-named devices: rank 0 takes GPU 0, rank 1 GPU 1), one NCCL
    # communicator over both processes' GPUs, where this build has MPI.
    if command -v mpirun > /dev/null && ldd "$(bin cifar10_train)" 2> /dev/null | grep -q libmpi; then
      OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
      OMPI_MCA_btl_vader_single_copy_mechanism=none \
        step train "mpirun -np 2 cifar10_train, NCCL across processes ($steps steps)" 300 "$state/logs/train_gpu_mpi.log" \
        mpirun -np 2 "$(bin cifar10_train)" --model resnet20 --batch_size 64 --max_steps "$steps" --log_every 10 \
        --json --eval_every 1 --builtin_train_size 6400 --builtin_test_size 1000 --loader_threads 2 --save_every 0 \
        --tensorboard=false --start_over delete --train_dir "$state/runs/gpu_mpi" \
        --devices /job:worker/task:0/device:GPU:0,/job:worker/task:1/device:GPU:1
      compare_runs "2 processes x 1 GPU against 2 CPU towers" gpu_mpi cpu2_per_tower cpu2_per_tower_b
    else
      record train "mpirun -np 2 cifar10_train on 2 GPUs" "skipped" 0 "" "this build has no MPI (the bundle builds without it)"
    fi
  fi
}

part_bench() {
  needs_gpu bench "training benchmarks on /gpu:0" || return
  local have_torch=0 round model precision flag
  python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2> /dev/null && have_torch=1
  # Where a step's time goes, op by op, with the GPU's own timings (core/trace.h): first, as the
  # figure a slow GPU path is diagnosed from.
  step bench "towerflow resnet20 fp32, traced (where the step's time goes)" 120 "$state/logs/bench_trace_resnet20.log" \
    "$(bin towerflow_bench_train)" --model resnet20 --batch 128 --devices /gpu:0 --steps 20 --warmup 10 \
    --trace "$state/logs/trace_resnet20_gpu.json"
  for round in 1 2; do  # alternating, so that both see the same state of the machine
    for model in resnet20 tfcnn; do
      for precision in fp32 bf16 fp16; do
        step bench "towerflow $model $precision, round $round" 120 "$state/logs/bench_tw_${model}_${precision}_$round.log" \
          "$(bin towerflow_bench_train)" --model "$model" --batch 128 --devices /gpu:0 --steps 100 --warmup 20 \
          --precision "$precision" --json
        if [ $have_torch = 1 ]; then
          flag=(); [ "$precision" = fp32 ] || flag=(--"$precision")
          step bench "PyTorch $model $precision, round $round" 120 "$state/logs/bench_pt_${model}_${precision}_$round.log" \
            python3 bench/peers/torch_cifar_bench.py --device cuda --channels-last --model "$model" --batch 128 \
            --steps 100 --warmup 20 --threads "$(nproc)" --json "${flag[@]}"
        fi
      done
    done
  done
  # The airbench94 recipe (docs/training-fast.md), one epoch on 50,000 synthetic images (no data
  # travels to the node): towerflow on /gpu:0 and the PyTorch reference on the same GPU, each
  # timed as airbench times itself, after a warm-up run of the reference.
  step bench "towerflow airbench94, 1 epoch on /gpu:0" 300 "$state/logs/bench_airbench94_tw.log" \
    "$(bin cifar10_train)" --recipe airbench94 --devices /gpu:0 --epochs 1 --builtin_train_size 50000 \
    --builtin_test_size 10000 --loader_threads 4 --progress json --log_every 1 --tensorboard=false \
    --start_over delete --train_dir "$state/runs/airbench94"
  if [ $have_torch = 1 ]; then
    python3 -c 'import os, sys
d = sys.argv[1]; os.makedirs(d, exist_ok=True)
for name, n in [("data_batch_%d.bin" % i, 10000) for i in range(1, 6)] + [("test_batch.bin", 10000)]:
    data = bytearray(os.urandom(n * 3073)); data[0::3073] = bytes(v % 10 for v in data[0::3073])
    open(os.path.join(d, name), "wb").write(data)' \
      "$state/airbench94_data"
    step bench "PyTorch airbench94, 1 epoch on cuda" 300 "$state/logs/bench_airbench94_pt.log" \
      python3 bench/peers/airbench94_torch.py --device cuda --data "$state/airbench94_data" --epochs 1 --json
  fi
  [ $have_torch = 1 ] || record bench "PyTorch peer" "skipped" 0 "" "this Python has no PyTorch with CUDA"
}

# ---- the report: everything recorded so far, every invocation ------------------------------
write_report() {
  python3 - "$state" "$out" "$budget" << 'EOF'
import glob, json, os, re, sys, tarfile
state, out, budget = sys.argv[1], sys.argv[2], int(sys.argv[3])
steps = [json.loads(l) for l in open(os.path.join(state, "steps.jsonl")) if l.strip()]
md = ["# towerflow GPU checks", ""]
probe = os.path.join(state, "logs", "probe.log")
if os.path.exists(probe):
    md += ["```"] + open(probe).read().rstrip().splitlines() + ["```", ""]
used = sum(s["seconds"] for s in steps)
md += [f"{len(steps)} steps, {used} s of the {budget}-second budget.", "",
       "| part | step | result | time | note |", "|---|---|---|---|---|"]
for s in steps:
    res = s["result"] if s["result"] == "passed" else f"**{s['result']}**"
    md.append(f"| {s['part']} | {s['step']} | {res} | {s['seconds']} s | {s.get('note', '').replace('|', '/')} |")
def section(title, lines):
    if lines:
        md.extend(["", f"## {title}", "", "```"] + lines + ["```"])
def grep(path, pattern):
    try:
        return [l.rstrip() for l in open(path, errors="replace") if re.search(pattern, l)]
    except OSError:
        return []
section("Parity: max error per op and dtype", grep(os.path.join(state, "logs", "parity.log"), r"^\[cuda\]|test cases|assertions|SKIPPED"))
section("GPU towers vs CPU towers", grep(os.path.join(state, "logs", "trainer_gpu.log"), r"^\[gpu-trainer\]|test cases"))
def after(path, marker):
    try:
        lines = [l.rstrip() for l in open(path, errors="replace")]
    except OSError:
        return []
    starts = [i for i, l in enumerate(lines) if marker in l]
    return lines[starts[0]:] if starts else []
section("Where a ResNet-20 step's time goes on /gpu:0 (towerflow_bench_train --trace, 20 steps)",
        after(os.path.join(state, "logs", "bench_trace_resnet20.log"), "trace of the"))
curves = []
for f in sorted(glob.glob(os.path.join(state, "logs", "compare_*.log"))):
    verdict = [l for l in grep(f, r"^(PASSED|FAILED)")]
    curves.append(f"{os.path.basename(f)[8:-4]}: {verdict[-1] if verdict else '(no verdict)'}")
section("Loss curves: GPU against CPU (bounds from two CPU runs)", curves)
# Benchmarks: towerflow and PyTorch img/s per model and precision, best of the rounds, and the ratio.
def ips(path, key):
    best = None
    for l in grep(path, r"^\{"):
        try:
            o = json.loads(l)
        except ValueError:
            continue
        v = o.get(key)
        if isinstance(v, (int, float)):
            best = v if best is None else max(best, v)
    return best
rows = []
for model in ("resnet20", "tfcnn"):
    for prec in ("fp32", "bf16", "fp16"):
        tw = [ips(f, "img_per_s") for f in glob.glob(os.path.join(state, "logs", f"bench_tw_{model}_{prec}_*.log"))]
        pt = [ips(f, "img_per_s_median") for f in glob.glob(os.path.join(state, "logs", f"bench_pt_{model}_{prec}_*.log"))]
        tw = [v for v in tw if v]; pt = [v for v in pt if v]
        if tw or pt:
            ratio = f"{max(tw) / max(pt):.2f}x" if tw and pt else "-"
            rows.append(f"| {model} | {prec} | {max(tw) if tw else '-'} | {max(pt) if pt else '-'} | {ratio} |")
if rows:
    md += ["", "## Training on /gpu:0: towerflow and PyTorch (img/s, best of the alternating rounds)", "",
           "| model | precision | towerflow | PyTorch | towerflow / PyTorch |", "|---|---|---|---|---|"] + rows
bad = [s for s in steps if s["result"] in ("FAILED", "timeout")]
md += ["", f"**{len(bad)} step(s) failed.**" if bad else "**No step failed.**", ""]
open(os.path.join(out, "gpu_report.md"), "w").write("\n".join(md))
with open(os.path.join(out, "gpu_steps.jsonl"), "w") as f:
    f.writelines(json.dumps(s) + "\n" for s in steps)
with tarfile.open(os.path.join(out, "gpu_logs.tar.xz"), "w:xz") as t:
    t.add(os.path.join(state, "logs"), arcname="logs")
EOF
}

for p in ${only//,/ }; do
  echo "run_gpu_checks: part $p"
  "part_$p"
done
write_report || echo "run_gpu_checks: could not write the report (python3 missing?)" >&2
echo "run_gpu_checks: report in $out/gpu_report.md (with gpu_steps.jsonl and gpu_logs.tar.xz)"
[ -f "$out/gpu_report.md" ] && cat "$out/gpu_report.md"
exit $failed
