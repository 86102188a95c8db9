#!/usr/bin/env bash
# The build's AUTO|ON|OFF options, and TOWERFLOW_CPU_ISAS, refuse any other value at configure
# time, naming the option, the value and the fix, before anything is searched for: a quoting slip
# such as -DTOWERFLOW_MPI=OFF"-DCMAKE_PREFIX_PATH=..." once configured MPI in where it was meant
# to be off.
#   test_configure_options.sh CMAKE SOURCE_DIR
set -uo pipefail
cmake=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAILED: $*"; exit 1; }
for opt in TOWERFLOW_CUDA TOWERFLOW_MPI TOWERFLOW_ONEDNN; do
  "$cmake" -S "$src" -B "$tmp/$opt" "-D$opt=OFF-DCMAKE_PREFIX_PATH=/x" > "$tmp/$opt.log" 2>&1 &&
    fail "$opt=OFF-DCMAKE_PREFIX_PATH=/x configured: $(tail -5 "$tmp/$opt.log")"
  tr -s ' \n' ' ' < "$tmp/$opt.log" | grep -q "$opt=OFF-DCMAKE_PREFIX_PATH=/x is not AUTO, ON or OFF; configure with -D$opt=AUTO, ON or OFF" ||
    fail "$opt: no message naming the option, the value and the fix: $(cat "$tmp/$opt.log")"
done
# The kernels' instruction sets: a name that is not one of them.
"$cmake" -S "$src" -B "$tmp/isas" "-DTOWERFLOW_CPU_ISAS=avx2;avx3" > "$tmp/isas.log" 2>&1 &&
  fail "TOWERFLOW_CPU_ISAS=avx2;avx3 configured: $(tail -5 "$tmp/isas.log")"
tr -s ' \n' ' ' < "$tmp/isas.log" | grep -q "TOWERFLOW_CPU_ISAS=avx2;avx3: 'avx3' is not an instruction set of the CPU kernels; configure with -DTOWERFLOW_CPU_ISAS= listing some of baseline, avx2 and avx512 (separated by ';'), or empty for all three" ||
  fail "TOWERFLOW_CPU_ISAS: no message naming the option, the value and the fix: $(cat "$tmp/isas.log")"
echo "4 passed, 0 failed"
