#!/usr/bin/env bash
# Sanitizer builds, CPU only, each in its own build folder:
#   asan  build-asan/: everything under AddressSanitizer + UndefinedBehaviorSanitizer (LeakSanitizer
#         included), then the whole ctest suite;
#   tsan  build-tsan/: the tests of every threaded component under ThreadSanitizer: tower workers
#         and the trainer, sync batch norm, the local communicator, the BFC allocator, the CPU
#         thread pool, the data loader and image-folder decoding, checkpoints and the run loop.
# Any report fails the test that caused it. Suppressions, if ever needed, live in
# scripts/sanitizers/*.supp with the reason for each entry.
#
#   scripts/sanitize.sh [asan|tsan|all]     (default: all)
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
case "$what" in asan | tsan | all) ;; *) echo "usage: $0 [asan|tsan|all]" >&2; exit 2 ;; esac
scripts/install_deps.sh
jobs=$(nproc)
supp=$PWD/scripts/sanitizers

# -O1 with line tables: fast enough to run the suite, quick to compile, and whole stacks in reports.
configure() {  # build_dir sanitizers
  cmake -S . -B "$1" -G Ninja -DTOWERFLOW_CUDA=OFF -DTOWERFLOW_SANITIZE="$2" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" >/dev/null
}

if [ "$what" != tsan ]; then
  start=$(date +%s)
  configure build-asan address,undefined
  cmake --build build-asan -j"$jobs"
  export ASAN_OPTIONS="detect_leaks=1:check_initialization_order=1:strict_init_order=1:detect_stack_use_after_return=1"
  export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$supp/ubsan.supp"
  ctest --test-dir build-asan --output-on-failure -j"$jobs"
  echo "sanitize: asan+ubsan build and whole suite in $(( $(date +%s) - start )) s"
fi

if [ "$what" != asan ]; then
  start=$(date +%s)
  tsan_tests=(test_tower_split test_tower_trainer test_tower_sync_batch_norm test_collectives test_memory
              test_core test_data test_train)
  configure build-tsan thread
  cmake --build build-tsan -j"$jobs" --target "${tsan_tests[@]}"
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp"
  regex="^($(IFS='|'; echo "${tsan_tests[*]}")):"
  ctest --test-dir build-tsan --output-on-failure -j"$jobs" -R "$regex"
  echo "sanitize: tsan build and threaded components' tests in $(( $(date +%s) - start )) s"
fi
