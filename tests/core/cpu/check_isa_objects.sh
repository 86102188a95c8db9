#!/usr/bin/env bash
# Each instruction set's kernel object holds only that set's instructions (no AVX register in the
# baseline's, no AVX-512 register in the AVX2 one's) and exports only its table: the proof that
# a CPU running a lower path never meets a higher one's instruction. The bf16 pair kernels:
# vdpbf16ps in the AVX512-BF16 object only, not in its emulated twin; the AMX kernels: tile
# instructions in the AMX object only.
#   check_isa_objects.sh OBJDUMP NM DIR
set -euo pipefail
objdump=$1 nm=$2 dir=$3
fail=0
check() {  # object, forbidden register pattern, what[, table]
  local n table=${4:-towerflow_cpu_kernels_$1}
  n=$("$objdump" -d "$dir/cpu_kernels_$1.o" | grep -cE "$2" || true)
  echo "$1: $n instructions on $3"
  [ "$n" -eq 0 ] || fail=1
  local globals
  globals=$("$nm" "$dir/cpu_kernels_$1.o" | awk '$2 ~ /^[A-TV-Z]$/ || $2 == "u" {print $3}')
  echo "$1: global symbols: $globals"
  [ "$globals" = "$table" ] || fail=1
}
check baseline '%[yz]mm' "AVX registers (ymm, zmm)"
check avx2 '%zmm' "AVX-512 registers (zmm)"
n=$("$objdump" -d "$dir/cpu_kernels_avx512.o" | grep -c '%zmm' || true)
echo "avx512: $n instructions on zmm registers"
[ "$n" -gt 0 ] || fail=1
if [ -f "$dir/cpu_kernels_avx512bf16.o" ]; then
  check avx512bf16_emulated 'vdpbf16ps' "AVX512-BF16 (vdpbf16ps)" towerflow_bf16_pairs_avx512bf16_emulated
  check avx512bf16 'NONE^' "nothing" towerflow_bf16_pairs_avx512bf16
  n=$("$objdump" -d "$dir/cpu_kernels_avx512bf16.o" | grep -c 'vdpbf16ps' || true)
  echo "avx512bf16: $n vdpbf16ps instructions"
  [ "$n" -gt 0 ] || fail=1
fi
if [ -f "$dir/cpu_kernels_amx.o" ]; then
  check amx_emulated 'tdpbf16ps|tileloadd|ldtilecfg|%tmm' "AMX tiles" towerflow_bf16_amx_emulated
  check amx 'vdpbf16ps' "AVX512-BF16 (vdpbf16ps)" towerflow_bf16_amx
  n=$("$objdump" -d "$dir/cpu_kernels_amx.o" | grep -c 'tdpbf16ps' || true)
  echo "amx: $n tdpbf16ps instructions"
  [ "$n" -gt 0 ] || fail=1
fi
exit $fail
