#!/usr/bin/env bash
# Each instruction set's kernel object holds only that set's instructions (no AVX register in the
# baseline's, no AVX-512 register in the AVX2 one's) and exports only its table: the proof that
# a CPU running a lower path never meets a higher one's instruction.
#   check_isa_objects.sh OBJDUMP NM DIR
set -euo pipefail
objdump=$1 nm=$2 dir=$3
fail=0
check() {  # object, forbidden register pattern, what
  local n
  n=$("$objdump" -d "$dir/cpu_kernels_$1.o" | grep -cE "$2" || true)
  echo "$1: $n instructions on $3"
  [ "$n" -eq 0 ] || fail=1
  local globals
  globals=$("$nm" "$dir/cpu_kernels_$1.o" | awk '$2 ~ /^[A-TV-Z]$/ || $2 == "u" {print $3}')
  echo "$1: global symbols: $globals"
  [ "$globals" = "towerflow_cpu_kernels_$1" ] || fail=1
}
check baseline '%[yz]mm' "AVX registers (ymm, zmm)"
check avx2 '%zmm' "AVX-512 registers (zmm)"
n=$("$objdump" -d "$dir/cpu_kernels_avx512.o" | grep -c '%zmm' || true)
echo "avx512: $n instructions on zmm registers"
[ "$n" -gt 0 ] || fail=1
exit $fail
