#!/usr/bin/env bash
# Builds towerflow with CUDA and runs everything that needs a GPU, then writes a short report.
#
#   tests/gpu/run_gpu_checks.sh [build-dir]        (default: build-gpu)
#
# Steps: configure with -DTOWERFLOW_CUDA=ON -DTOWERFLOW_WERROR=ON (sm_80 and sm_90 unless
# CMAKE_CUDA_ARCHITECTURES is set in the environment), build, run the [cuda] parity suite
# (test_core_cuda_parity: every GPU kernel against its CPU twin, max errors printed), the no-GPU
# checks (test_core_cuda), the whole CTest suite, and the GPU benchmarks that exist in the build
# (towerflow_bench_gpu_ops; towerflow_bench_train on /gpu:0, and on every GPU as towers when
# there are several; and the benchmark suite's GPU part, bench/suite.py --gpu-only), the NCCL
# communicator tests (one rank; two ranks with two GPUs), GPU
# towers against CPU towers (test_tower_trainer_gpu), and cifar10_train for TW_GPU_CHECK_STEPS
# (300) steps with each reduction, and in bf16 and fp16, on the GPU(s) and on as many CPU towers
# (the training benchmark also in bf16 and fp16), loss curves compared
# by tests/gpu/compare_loss_curves.py (tolerances in its header); with two GPUs and mpirun, the
# same across 2 processes (NCCL over both processes' GPUs) and the GPU stream-ordering cases.
# The report (markdown) goes to <build-dir>/gpu_report.md and to stdout; the full logs sit next
# to it. Exit status: 0 when every step passed, 1 otherwise, 2 when there is no GPU to check.
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-gpu}
archs=${CMAKE_CUDA_ARCHITECTURES:-80;90}
mkdir -p "$build"
report="$build/gpu_report.md"
status=0

step() {  # step NAME LOG COMMAND...: runs a command, logs it, records pass/fail in the report
  local name=$1 log=$2; shift 2
  local start=$(date +%s)
  if "$@" >"$log" 2>&1; then
    echo "| $name | passed | $(( $(date +%s) - start )) s | \`$log\` |" >>"$report"
  else
    local rc=$?
    echo "| $name | **FAILED** (exit $rc) | $(( $(date +%s) - start )) s | \`$log\` |" >>"$report"
    status=1
  fi
}

{
  echo "# towerflow GPU checks"
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
  echo "- host: $(uname -n), $(nproc) CPU threads"
  if command -v nvidia-smi >/dev/null; then
    echo "- GPUs:"
    nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader |
      sed 's/^/  - /'
  else
    echo "- GPUs: nvidia-smi not found"
  fi
  echo "- nvcc: $(/usr/local/cuda/bin/nvcc --version 2>/dev/null | tail -1)"
  echo
  echo "| step | result | time | log |"
  echo "|---|---|---|---|"
} >"$report"

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "| GPU present | **no GPU** (nvidia-smi finds none) | | |" >>"$report"
  cat "$report"
  echo "run_gpu_checks: no GPU on this machine; nothing to check" >&2
  exit 2
fi

step "configure (CUDA ON, -Werror, archs $archs)" "$build/configure.log" \
  cmake -S . -B "$build" -G Ninja -DTOWERFLOW_CUDA=ON -DTOWERFLOW_WERROR=ON \
        "-DCMAKE_CUDA_ARCHITECTURES=$archs"
step "build" "$build/build.log" cmake --build "$build" -j"$(nproc)"

step "[cuda] parity suite (test_core_cuda_parity)" "$build/parity.log" \
  "$build/bin/test_core_cuda_parity" --durations yes
step "NCCL communicator, one rank (test_nccl_communicator)" "$build/nccl1.log" \
  "$build/bin/test_nccl_communicator"
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$ngpu" -gt 1 ]; then
  step "NCCL communicator, two ranks (test_nccl_communicator --two-gpu)" "$build/nccl2.log" \
    "$build/bin/test_nccl_communicator" --two-gpu
else
  echo "| NCCL communicator, two ranks | skipped: needs 2 GPUs, $ngpu found | | |" >>"$report"
fi
step "GPU towers vs CPU towers (test_tower_trainer_gpu)" "$build/trainer_gpu.log" \
  "$build/bin/test_tower_trainer_gpu" --durations yes
step "CUDA checks without GPU use (test_core_cuda)" "$build/core_cuda.log" \
  "$build/bin/test_core_cuda"
step "whole CTest suite" "$build/ctest.log" \
  ctest --test-dir "$build" --output-on-failure -j"$(nproc)"

# Training end to end: cifar10_train on the GPU(s) and on as many CPU towers, same data, same
# initial parameters, each reduction; loss curves compared by compare_loss_curves.py (its
# tolerances: mean |loss diff| <= 0.05 and <= 0.15 at every logged step, final test loss <= 0.10).
train_steps=${TW_GPU_CHECK_STEPS:-300}
ntowers=$(( ngpu > 2 ? 2 : ngpu ))
gpu_towers=$(seq -s, -f '/gpu:%g' 0 $((ntowers - 1)))
cpu_towers=$(seq -s, -f '/cpu:%g' 0 $((ntowers - 1)))
for reduction in all_reduce bucketed:0.05 parameter_device; do
  tag=${reduction%%:*}
  common=(--model resnet20 --batch_size 64 --max_steps "$train_steps" --log_every 10 --json
          --eval_every 1 --builtin_train_size 6400 --builtin_test_size 1000 --loader_threads 2
          --reduction "$reduction" --save_every 0 --start_over delete)   # the script's own, rerun each time
  step "cifar10_train $reduction on $gpu_towers ($train_steps steps)" "$build/train_gpu_$tag.log" \
    "$build/bin/cifar10_train" "${common[@]}" --devices "$gpu_towers" \
    --train_dir "$build/train_gpu_$tag"
  step "cifar10_train $reduction on $cpu_towers ($train_steps steps)" "$build/train_cpu_$tag.log" \
    "$build/bin/cifar10_train" "${common[@]}" --devices "$cpu_towers" \
    --device_count "CPU=$ntowers" --train_dir "$build/train_cpu_$tag"
  step "loss curves GPU vs CPU, $reduction" "$build/compare_$tag.log" \
    python3 tests/gpu/compare_loss_curves.py "$build/train_gpu_$tag.log" "$build/train_cpu_$tag.log"
done

# bf16 and fp16 precision: the same run on the GPU(s) (cuDNN and cuBLAS on tensor cores; fp16
# with dynamic loss scaling) against the CPU towers' run in the same precision, all-reduce only.
for precision in bf16 fp16; do
  common=(--model resnet20 --batch_size 64 --max_steps "$train_steps" --log_every 10 --json
          --eval_every 1 --builtin_train_size 6400 --builtin_test_size 1000 --loader_threads 2
          --reduction all_reduce --precision "$precision" --save_every 0 --start_over delete)
  step "cifar10_train $precision on $gpu_towers ($train_steps steps)" "$build/train_gpu_$precision.log" \
    "$build/bin/cifar10_train" "${common[@]}" --devices "$gpu_towers" --train_dir "$build/train_gpu_$precision"
  step "cifar10_train $precision on $cpu_towers ($train_steps steps)" "$build/train_cpu_$precision.log" \
    "$build/bin/cifar10_train" "${common[@]}" --devices "$cpu_towers" \
    --device_count "CPU=$ntowers" --train_dir "$build/train_cpu_$precision"
  step "loss curves GPU vs CPU, $precision" "$build/compare_$precision.log" \
    python3 tests/gpu/compare_loss_curves.py "$build/train_gpu_$precision.log" "$build/train_cpu_$precision.log"
done

# Across processes: 2 processes x 1 GPU (task-named devices give rank 0 GPU 0 and rank 1 GPU 1),
# one NCCL communicator over both processes' GPUs, against the same run's 2 CPU towers.
if [ "$ngpu" -ge 2 ] && command -v mpirun >/dev/null; then
  mpi_env=(env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1)
  common=(--model resnet20 --batch_size 64 --max_steps "$train_steps" --log_every 10 --json
          --eval_every 1 --builtin_train_size 6400 --builtin_test_size 1000 --loader_threads 2
          --reduction all_reduce --save_every 0 --start_over delete)
  step "mpirun -np 2 cifar10_train, NCCL across processes ($train_steps steps)" "$build/train_gpu_mpi.log" \
    "${mpi_env[@]}" mpirun -np 2 "$build/bin/cifar10_train" "${common[@]}" \
    --devices /job:worker/task:0/device:GPU:0,/job:worker/task:1/device:GPU:1 --train_dir "$build/train_gpu_mpi"
  step "loss curves GPU across processes vs CPU towers" "$build/compare_mpi.log" \
    python3 tests/gpu/compare_loss_curves.py "$build/train_gpu_mpi.log" "$build/train_cpu_all_reduce.log"
fi

if [ -x "$build/bin/towerflow_bench_gpu_ops" ]; then
  step "GPU op benchmark" "$build/bench_gpu_ops.log" "$build/bin/towerflow_bench_gpu_ops"
fi
if [ -x "$build/bin/towerflow_bench_train" ]; then
  step "training benchmark on /gpu:0" "$build/bench_train_gpu.log" \
    "$build/bin/towerflow_bench_train" --model resnet20 --batch 128 --devices /gpu:0 --json
  for precision in bf16 fp16; do
    step "training benchmark on /gpu:0, $precision" "$build/bench_train_gpu_$precision.log" \
      "$build/bin/towerflow_bench_train" --model resnet20 --batch 128 --devices /gpu:0 --json \
      --precision "$precision"
  done
  if [ "$ngpu" -gt 1 ]; then
    gpus=$(seq -s, -f '/gpu:%g' 0 $((ngpu - 1)))
    step "training benchmark on $gpus (all_reduce)" "$build/bench_train_gpus.log" \
      "$build/bin/towerflow_bench_train" --model resnet20 --batch $((128 * ngpu)) --devices "$gpus" --json
  fi
fi
# The benchmark suite's GPU part (bench/suite.py --gpu-only): its figures, with the commands that
# reproduce them, in $build/bench/gpu.{md,jsonl}; the report is appended below.
step "benchmark suite, GPU part (bench/suite.py --gpu-only)" "$build/bench_suite_gpu.log" \
  python3 bench/suite.py --build "$build" --gpu-only --out "$build/bench" --name gpu

{
  echo
  echo "## Parity: max error per op"
  echo
  echo '```'
  grep '^\[cuda\]' "$build/parity.log" 2>/dev/null || echo "(no parity output)"
  grep -E 'SKIPPED|test cases|assertions' "$build/parity.log" 2>/dev/null | tail -3
  echo '```'
  echo
  echo "## GPU towers vs CPU towers"
  echo
  echo '```'
  grep '^\[gpu-trainer\]' "$build/trainer_gpu.log" 2>/dev/null || echo "(no trainer output)"
  for f in "$build"/compare_*.log; do
    [ -f "$f" ] && echo "$(basename "$f" .log): $(tail -1 "$f")"
  done
  echo '```'
  for b in bench_gpu_ops bench_train_gpu bench_train_gpus; do
    if [ -f "$build/$b.log" ]; then
      echo
      echo "## $b"
      echo
      echo '```'
      grep -v '^{' "$build/$b.log" | tail -40
      echo '```'
    fi
  done
  if [ -f "$build/bench/gpu.md" ]; then
    echo
    echo "## Benchmark suite, GPU part"
    echo
    sed -e '1d' -e 's/^## /### /' "$build/bench/gpu.md"
  fi
  echo
  if [ $status -eq 0 ]; then echo "**All GPU checks passed.**"; else echo "**Some GPU checks FAILED**: see the logs above."; fi
} >>"$report"

cat "$report"
exit $status
