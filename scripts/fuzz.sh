#!/usr/bin/env bash
# Builds the libFuzzer targets in fuzz/ with clang (-fsanitize=fuzzer,address,undefined) in
# build-asan/ (the build scripts/sanitize.sh asan tests; see scripts/sanitizer_env.sh) and runs
# each for SECONDS (default 30), starting from its seed corpus fuzz/corpus/NAME/. Inputs that
# reach new code are kept in build-asan/fuzz-corpus/NAME/ (not in the repository); a crash, a
# sanitizer report, a leak, a timeout or an exception other than a user-facing error stops the
# script with the input saved as build-asan/fuzz-crashes/NAME/crash-* (reproduce:
# build-asan/bin/fuzz_NAME FILE). Make each finding a Catch2 regression test. As many targets run
# at once as there are cores.
#
#   scripts/fuzz.sh [SECONDS] [NAME...]      (default: every target in fuzz/CMakeLists.txt)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
shift || true
scripts/install_deps.sh fuzz
source scripts/sanitizer_env.sh
build=build-asan
tw_configure_asan
cmake --build "$build" -j"$(nproc)" --target towerflow_fuzzers

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for bin in "$build"/bin/fuzz_*; do targets+=("${bin##*/fuzz_}"); done
fi
# One target at a time per core (libFuzzer runs on one thread): each still fuzzes for SECONDS.
fuzz_one() {  # name: fuzzes it; its summary line in fuzz-logs/NAME.summary, exit 1 on a finding
  local name=$1 log="$build/fuzz-logs/$1.log" runs cov
  mkdir -p "$build/fuzz-corpus/$name" "$build/fuzz-crashes/$name" "$build/fuzz-logs"
  # -rss_limit_mb: an input that makes a parser take more than 2 GiB is a finding too.
  if "$build/bin/fuzz_$name" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix="$build/fuzz-crashes/$name/" "$build/fuzz-corpus/$name" "fuzz/corpus/$name" >"$log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
    echo "fuzz: $name: $runs runs in ${seconds} s, $cov, no finding" > "$build/fuzz-logs/$name.summary"
  else
    echo "fuzz: $name FOUND A PROBLEM; the end of $log:" > "$build/fuzz-logs/$name.summary"
    tail -40 "$log" >> "$build/fuzz-logs/$name.summary"
    return 1
  fi
}
mkdir -p "$build/fuzz-logs"
rm -f "$build"/fuzz-logs/*.summary
for name in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$(nproc)" ]; do wait -n || true; done
  fuzz_one "$name" &
done
wait || true
status=0
for name in "${targets[@]}"; do
  summary="$build/fuzz-logs/$name.summary"
  if [ -f "$summary" ]; then cat "$summary"; else echo "fuzz: $name did not finish"; fi
  grep -q ', no finding$' "$summary" 2>/dev/null || status=1
done
exit $status
