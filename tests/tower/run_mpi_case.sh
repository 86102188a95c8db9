#!/usr/bin/env bash
# Runs test cases that end a job's process group the way a real failure does (a rank that fails
# or does not come): every rank must pass its checks, and the launcher then reports the job's
# abnormal end, so its exit status is not the verdict; the ranks' Catch2 summaries are.
#   run_mpi_case.sh MPIEXEC NP TEST_BINARY TAG
set -uo pipefail
mpiexec=$1 np=$2 binary=$3 tag=$4
out=$(timeout 120 "$mpiexec" -n "$np" "$binary" "$tag" 2>&1)
status=$?
echo "$out"
passed=$(grep -c "All tests passed" <<< "$out")
if [ "$status" -eq 124 ]; then
  echo "FAIL: the job did not end within 120 s (a rank hung)"
  exit 1
fi
if [ "$passed" -ne "$np" ]; then
  echo "FAIL: $passed of $np ranks passed (mpirun exit status $status)"
  exit 1
fi
echo "every rank passed (mpirun exit status $status)"
