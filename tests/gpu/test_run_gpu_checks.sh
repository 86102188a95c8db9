#!/usr/bin/env bash
# run_gpu_checks.sh on a machine without a GPU: each GPU part says "no GPU" (not passed, not
# failed), an unknown part is refused, a step is stopped at the budget's end and recorded as
# skipped, and the report is at most 6 files in --out. Exit 77 where
# CUDA sees a GPU (the check itself runs there).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
check=$root/tests/gpu/run_gpu_checks.sh
fail() { echo "FAILED: $*"; exit 1; }

out=$("$check" --only probe,nccl --build "$tmp/b" 2>&1)
[ $? -eq 2 ] && fail "--only probe,nccl exited 2: $out"
"$check" --only gpus --build "$tmp/b" > "$tmp/bad.log" 2>&1
[ $? -eq 2 ] && grep -q "'gpus' is not a part; use probe,build" "$tmp/bad.log" || fail "an unknown part was not refused: $(cat "$tmp/bad.log")"
# A step still running when the budget ends is stopped there and recorded as skipped (a slot's
# end), not as a timeout, and the report is written: here a test_core_cuda that would run 60 s.
mkdir -p "$tmp/slow/bin"
printf '#!/bin/sh\nsleep 60\n' > "$tmp/slow/bin/test_core_cuda"
chmod +x "$tmp/slow/bin/test_core_cuda"
t0=$(date +%s)
"$check" --only parity --budget 3 --build "$tmp/slow" --out "$tmp/slow_out" > "$tmp/slow.log" 2>&1
dt=$(( $(date +%s) - t0 ))
[ "$dt" -lt 30 ] || fail "a step ran ${dt} s past a 3-second budget"
grep -q '"step": *"CUDA checks without a GPU (test_core_cuda)", "result": *"skipped".*end of the 3-second budget' \
  "$tmp/slow_out/gpu_steps.jsonl" || fail "the step stopped by the budget is not recorded as skipped: $(cat "$tmp/slow_out/gpu_steps.jsonl" "$tmp/slow.log")"
if grep -q '"part":"probe".*"note":"[1-9][0-9]* GPU' "$tmp/b/checks/steps.jsonl"; then
  echo "TEST SKIPPED: CUDA sees a GPU here; tests/gpu/run_gpu_checks.sh is the check"
  exit 77
fi
"$check" --only trainer,nccl,train,bench --build "$tmp/b" --out "$tmp/out" > "$tmp/run.log" 2>&1 ||
  fail "without a GPU the GPU parts failed: $(tail -5 "$tmp/run.log")"
for part in trainer nccl train bench; do
  grep -q "\"part\": *\"$part\",.*\"result\": *\"no GPU\"" "$tmp/out/gpu_steps.jsonl" || fail "part $part did not say no GPU: $(cat "$tmp/out/gpu_steps.jsonl")"
done
if grep -v '"part": *"probe"' "$tmp/out/gpu_steps.jsonl" | grep -q '"result": *"\(passed\|FAILED\|timeout\)"'; then
  fail "a GPU part passed or failed without a GPU: $(cat "$tmp/out/gpu_steps.jsonl")"
fi
n=$(find "$tmp/out" -type f | wc -l)
[ "$n" -le 6 ] || fail "the report is $n files, more than 6"
for f in gpu_report.md gpu_steps.jsonl gpu_logs.tar.xz; do [ -s "$tmp/out/$f" ] || fail "no $f in the report"; done
grep -q '| nccl | NCCL communicator, one rank | \*\*no GPU\*\*' "$tmp/out/gpu_report.md" || fail "the report does not list nccl as no GPU"
echo "1 passed, 0 failed"
