#!/usr/bin/env bash
# Sanitizer builds, CPU only, with clang (scripts/sanitizer_env.sh), each in its own build folder:
#   asan  build-asan/: everything under AddressSanitizer + UndefinedBehaviorSanitizer (LeakSanitizer
#         included), then the whole ctest suite;
#   tsan  build-tsan/ (the kernels for the baseline instruction set alone, sanitizer_env.sh): the
#         tests of every threaded component under ThreadSanitizer: tower workers
#         and the trainer, sync batch norm, the local communicator, the NCCL communicator's logic
#         (against a double of NCCL), the BFC allocator, the CPU
#         thread pool, the data loader and image-folder decoding, checkpoints and the run loop.
#   ci    build-asan/ (the kernels for the baseline alone): only what parses outside input
#         (files, INI, flags, checkpoints, event files, images) and its tests under ASan + UBSan:
#         the part of asan that fits CI's time (the fuzz targets, scripts/fuzz.sh, build in the
#         same folder next).
# The processes mpirun starts are not under TSan: Open MPI's own locking (uninstrumented) reports
# races and lock inversions inside libmpi; under ASan they run without leak checking
# (tests/tower/CMakeLists.txt says why).
# Any report fails the test that caused it. Suppressions, if ever needed, live in
# scripts/sanitizers/*.supp with the reason for each entry.
#
#   scripts/sanitize.sh [asan|tsan|all|ci]     (default: all)
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
case "$what" in asan | tsan | all | ci) ;; *) echo "usage: $0 [asan|tsan|all|ci]" >&2; exit 2 ;; esac
scripts/install_deps.sh fuzz
source scripts/sanitizer_env.sh
jobs=$(nproc)

if [ "$what" = ci ]; then
  start=$(date +%s)
  ci_tests=(test_io test_core_platform test_data)
  tw_configure_asan
  cmake --build build-asan -j"$jobs" --target "${ci_tests[@]}"
  regex="^($(IFS='|'; echo "${ci_tests[*]}")):"
  ctest --test-dir build-asan --output-on-failure -j"$jobs" -R "$regex"
  echo "sanitize: asan+ubsan build and the input parsers' tests in $(( $(date +%s) - start )) s"
  exit 0
fi

if [ "$what" != tsan ]; then
  start=$(date +%s)
  tw_configure_asan "" -O1
  cmake --build build-asan -j"$jobs"
  ctest --test-dir build-asan --output-on-failure -j"$jobs"
  echo "sanitize: asan+ubsan build and whole suite in $(( $(date +%s) - start )) s"
fi

if [ "$what" != asan ]; then
  start=$(date +%s)
  tsan_tests=(test_tower_split test_tower_trainer test_tower_sync_batch_norm test_collectives test_nccl_ranks
              test_memory test_core test_data test_train)
  tw_configure_tsan
  cmake --build build-tsan -j"$jobs" --target "${tsan_tests[@]}"
  regex="^($(IFS='|'; echo "${tsan_tests[*]}")):"
  # Left to the ordinary suite, as they took most of this step's time under TSan and check no
  # thread the other cases do not: the crash-and-resume case trains tfcnn three times in each of
  # fp32, bf16 and fp16 (about 110 s), on the run loop's threads, which "a hook stops the run
  # early: ... resuming finishes it bit for bit" and the other fit cases run here; the killed
  # checkpoint writer (about 50 s) is a process of one thread.
  left_out=("resuming after a crash reproduces the uninterrupted run bit for bit"
            "a checkpoint writer killed at random points never leaves a partial checkpoint")
  ctest --test-dir build-tsan --output-on-failure -j"$jobs" -R "$regex" \
    -E "^test_train:($(IFS='|'; echo "${left_out[*]}"))$"
  echo "sanitize: tsan build and threaded components' tests in $(( $(date +%s) - start )) s"
fi
